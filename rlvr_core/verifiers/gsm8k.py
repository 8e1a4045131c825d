"""GSM8K: the final answer is one number; compare it numerically with the gold number.

Two extraction modes, because both are in use and they disagree (BUGZOO G-verifier-format):

- ``flexible`` (default): the *last* number anywhere in the response. Tolerant of format, so a model
  that has not learnt ``#### N`` yet still gets signal. Its known failure is a model that keeps
  writing after its answer (a new "Question: …" block, BUGZOO G-stop-seq): the last number then comes
  from the continuation. We cannot fix that here (stop sequences belong to the prompt template), but
  we flag it in ``extra["continued_after_answer"]`` so the pipeline can count it.
- ``strict``: only ``#### N`` or ``The answer is N`` counts (the last such marker wins); anything else
  is ``no_answer``.

Numbers are compared as exact decimals after removing thousands separators, ``$`` and units, so
``1,234`` == ``1234`` and ``27.0`` == ``27``; no float rounding is involved.

Gold may be the bare number (``"35"``, ``35``) or a full GSM8K answer text ending in ``#### 35``.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

from rlvr_core.verifiers.base import Outcome, Status, register_verifier, shaped_reward

# One number: optional sign, optional "$", digits with proper thousands groups ("1,234,567") or plain
# digits, optional decimals. The sign is only a sign when it does not follow a word character or a
# closing bracket, so "7-2" reads as 7 and 2, not 7 and -2. Unicode minus (U+2212) counts as "-".
_NUMBER = re.compile(
    r"(?:(?<![\w)\]])(?P<sign>[-\u2212]))?\$?"
    r"(?<![\d.])(?P<num>(?:\d{1,3}(?:,\d{3})+(?![\d])|\d+)(?:\.\d+)?)"
)
# Strict markers. "#### N" is GSM8K's own answer line; "The answer is N" is the few-shot CoT format
# (Wei et al.) that lm-evaluation-harness' gsm8k-cot uses.
_STRICT = re.compile(
    r"(?:####|[Tt]he (?:final )?answer is:?)\s*(?P<ans>[-\u2212]?\$?\s?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?)"
)
# Answer spraying: "… 3 or 4" right after a marker (or on the last line when there is none). A number
# starts only where no digit, comma or point precedes it and its digits are matched possessively, so the
# scan stays linear on a megabyte of "1,1,1,…".
_NUM = r"(?<![\d,.])[-\u2212]?\$?\d[\d,]*+(?:\.\d+)?"
_HEDGE = re.compile(_NUM + r"\s*,?\s*\bor\s+" + _NUM)
# A model that keeps going after its answer usually starts a new few-shot block (BUGZOO G-stop-seq).
_CONTINUATION = re.compile(r"\n\s*(?:Question|Q|Problem)\s*:", re.IGNORECASE)


def _to_decimal(text: str) -> Decimal | None:
    """"$1,234.50" → Decimal('1234.50'); None when it is not a number."""
    cleaned = text.replace("\u2212", "-").replace("$", "").replace(",", "").replace(" ", "")
    try:
        return Decimal(cleaned)
    except InvalidOperation:
        return None


def _numbers(text: str) -> list[str]:
    """Every number in `text`, in order, as written (sign and thousands separators kept, "$" dropped)."""
    return [(m.group("sign") or "") + m.group("num") for m in _NUMBER.finditer(text)]


def extract_flexible(response: str) -> str | None:
    nums = _numbers(response)
    return nums[-1] if nums else None


def _last_strict(response: str) -> re.Match[str] | None:
    last = None
    for last in _STRICT.finditer(response):
        pass
    return last


def stated_answers(response: str) -> set[Decimal]:
    """The distinct values of the final-answer markers: the ``#### N`` lines when there are any (GSM8K's
    own answer line; a gold solution may also say "the final answer is 15 gallons … = 120" above its
    ``#### 120``), else the "The answer is N" statements."""
    matches = list(_STRICT.finditer(response))
    hashes = [m for m in matches if m.group(0).startswith("####")]
    return {v for m in (hashes or matches) if (v := _to_decimal(m.group("ans"))) is not None}


def hedged(response: str, marker: re.Match[str] | None) -> bool:
    """True when the answer offers alternatives ("#### 3 or 4"): the marker's line, else the last line."""
    if marker is not None:
        end = response.find("\n", marker.start())
        tail = response[marker.start():] if end < 0 else response[marker.start():end]
    else:
        lines = [ln for ln in response.splitlines() if ln.strip()]
        tail = lines[-1] if lines else ""
    return bool(_HEDGE.search(tail))


def several_answers(response: str, marker: re.Match[str] | None) -> str | None:
    """Why the response states more than one final answer, or None. The rule: a response that gives
    several different final numbers ("#### 3 #### 4", "The answer is 3. The answer is 4", "3 or 4")
    is wrong whichever of them is the gold, so answer spraying never pays."""
    values = stated_answers(response)
    if len(values) > 1:
        return "several final answers: " + ", ".join(sorted(str(v) for v in values))
    if hedged(response, marker):
        return "the final answer offers alternatives ('N or M')"
    return None


def gold_number(gold: Any) -> Decimal:
    """The gold number from a bare number, a numeric string, or a full GSM8K answer ("… #### 35")."""
    if isinstance(gold, bool):  # bool is an int subclass; a bool gold is a data bug, not 1/0
        raise TypeError(f"gsm8k gold must be a number or text, got bool {gold!r}")
    if isinstance(gold, (int, float, Decimal)):
        return Decimal(str(gold))
    if not isinstance(gold, str):
        raise TypeError(f"gsm8k gold must be a number or text, got {type(gold).__name__}")
    text = gold.rsplit("####", 1)[1] if "####" in gold else gold
    value = _to_decimal(text.strip().rstrip("."))
    if value is None:
        # Fall back to the last number in the text; a gold with no number at all is a data bug.
        last = extract_flexible(text)
        value = _to_decimal(last) if last is not None else None
    if value is None:
        raise ValueError(f"gsm8k gold has no number: {gold!r}")
    return value


@register_verifier("gsm8k")
class GSM8KVerifier:
    name = "gsm8k"
    version = "2"  # 2: several different final answers score 0
    # Linear-time regexes over the response and a Decimal compare: no input makes it run long
    # (tests/verifiers/test_verifier_limits.py feeds it adversarial megabyte responses).
    can_hang = False

    def warm_up(self) -> None:  # its regexes are compiled at import
        pass

    def __init__(self, mode: str = "flexible", format_reward: float = 0.0) -> None:
        if mode not in ("flexible", "strict"):
            raise ValueError(f"gsm8k mode must be 'flexible' or 'strict', got {mode!r}")
        self.mode = mode
        self.format_reward = format_reward

    def verify(self, response: str, gold: Any) -> Outcome:
        if not isinstance(response, str):
            raise TypeError(f"response must be str, got {type(response).__name__}")
        target = gold_number(gold)  # raises on a bad gold: that is an error, not an incorrect answer
        strict_match = _last_strict(response)
        strict_ans = strict_match.group("ans") if strict_match else None
        extracted = strict_ans if self.mode == "strict" else extract_flexible(response)
        formatted = strict_ans is not None
        extra = {"formatted": formatted}
        if strict_match is not None:
            # Text after the "#### N" / "The answer is N" line that starts a new question: the
            # flexible extractor would read its numbers (BUGZOO G-stop-seq).
            extra["continued_after_answer"] = bool(_CONTINUATION.search(response, strict_match.end()))
        if extracted is None:
            return Outcome(Status.NO_ANSWER, 0.0, None, self.name, self.version, f"mode={self.mode}", extra)
        value = _to_decimal(extracted)
        why_not = several_answers(response, strict_match)
        if why_not is not None:
            extra["several_answers"] = True
            reward = shaped_reward(False, formatted, self.format_reward)
            return Outcome(Status.INCORRECT, reward, extracted, self.name, self.version, why_not, extra)
        status = Status.CORRECT if value is not None and value == target else Status.INCORRECT
        reward = shaped_reward(status is Status.CORRECT, formatted, self.format_reward)
        return Outcome(status, reward, extracted, self.name, self.version, f"mode={self.mode}", extra)
