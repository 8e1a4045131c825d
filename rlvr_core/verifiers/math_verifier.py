"""MATH-style answers: extract, normalise and compare symbolically, on top of math-verify.

We do not write a CAS or a LaTeX parser: math-verify (Hugging Face, 0.9.0) already extracts answers
(``\\boxed{}`` with nesting, "final answer is …", the last ``$…$``, plain expressions), normalises
them (units, ``\\text{}``, ``\\left(``, malformed ``\\frac12``) and compares them with sympy
(numeric, symbolic, sets, intervals, matrices). What we add, and where we differ from a plain
``verify(parse(gold), parse(response))`` loop:

1. **Errors are errors.** math-verify by default catches every exception and returns ``False`` (or
   an empty parse): a broken input is silently "incorrect" (BUGZOO G-verifier-error). We call it
   with ``raise_on_error=True``, try each (gold, prediction) candidate pair on its own the way its
   ``verify`` does, and report ``error`` only when no pair matched and at least one raised.
2. **Timeouts are timeouts, and measure the item.** math-verify's own timeout is a wall-clock
   ``signal.alarm`` of whole seconds (5 by default) that returns ``False``. We switch it off and limit
   the whole verification to ``time_limit_s`` of *CPU time* instead (`limits.cpu_time_limit`; the pool
   sets it to its own timeout), reported as ``timeout``: a loaded machine slows an item down but does
   not fail it. Signals only work on a process's main thread; C-level work (a huge integer power) and
   other threads are covered by `VerifierPool`'s kill.
3. **No answer is not a wrong answer.** An empty extraction is ``no_answer``.
4. **Two modes.** ``lenient`` (default) is math-verify's own extraction with all its fallbacks.
   ``boxed`` is strict: only the content of the *last* ``\\boxed{…}`` / ``\\fbox{…}`` counts; no
   box → ``no_answer``. Use it to measure format compliance (BUGZOO G-verifier-format).

Gold may be a bare answer (MATH-500's ``answer`` field, e.g. ``\\left( 3, \\frac{\\pi}{2} \\right)``)
or a full solution containing ``\\boxed{…}``; for the latter we take the last box, as the MATH
graders do. A bare answer is wrapped in ``\\boxed{}`` before parsing so math-verify reads it as one
LaTeX answer rather than hunting for the last number inside it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from typing import Any

from rlvr_core.verifiers.base import Outcome, Status, register_verifier, shaped_reward
from rlvr_core.verifiers.limits import VerifierTimeout, cpu_time_limit


# Generic answer shapes (integers, fractions, radicals, π, intervals, tuples, matrices, sets, degrees,
# percentages, text), not benchmark data: `warm_up` verifies each once.
MATH_EXAMPLES = [
    ("\\frac{1}{2}", "0.5"), ("\\dfrac{3}{4}", "\\frac{6}{8}"), ("2\\sqrt{3}", "\\sqrt{12}"),
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"), ("3\\pi", "3\\pi"), ("\\frac{\\pi}{6}", "30^\\circ"),
    ("(-\\infty, 2]", "(-\\infty,2]"), ("[0,1)", "[0, 1)"), ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi/2)"),
    ("\\{1, 2, 3\\}", "1,2,3"), ("x^2 + 2x + 1", "(x+1)^2"), ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}",
    "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"), ("10\\%", "10"), ("27", "27.0"), ("-\\frac{7}{3}", "-7/3"),
    ("\\text{(C)}", "C"), ("5\\sqrt{2}+1", "1+5\\sqrt{2}"), ("e^{i\\pi}", "-1"), ("\\log_2 8", "3"),
    ("1,000", "1000"), ("\\$18", "18"), ("2^{10}", "1024"), ("\\binom{5}{2}", "10"), ("4!", "24"),
    ("y = 2x + 3", "2x+3"), ("\\sin x", "\\sin(x)"), ("\\infty", "\\infty"), ("i", "i"), ("a+b", "b+a"),
]

# Parsed golds kept per verifier (one verifier per pool worker).
_GOLD_CACHE = 4096


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{…}`` (or ``\\fbox{…}``, or ``\\boxed 5``), braces balanced.

    Same contract as ``last_boxed_only_string`` + ``remove_boxed`` in the Hendrycks MATH and
    lm-evaluation-harness graders, written as one brace-counting scan. None when there is no box or
    its braces never close.
    """
    idx = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if idx < 0:
        return None
    rest = text[idx:]
    head = "\\boxed" if rest.startswith("\\boxed") else "\\fbox"
    after = rest[len(head):]
    if after.startswith(" "):  # "\boxed 5": the answer runs to the next "$" or end of line
        return after[1:].split("$")[0].split("\n")[0].strip() or None
    if not after.startswith("{"):
        return None
    depth = 0
    for i, ch in enumerate(after):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return after[1:i]
    return None


@register_verifier("math")
class MathVerifier:
    name = "math"
    version = "1"
    can_hang = True  # sympy can spin for ever on a crafted expression

    def __init__(
        self,
        mode: str = "lenient",
        format_reward: float = 0.0,
        float_rounding: int = 6,
        numeric_precision: int = 15,
        time_limit_s: float = 5.0,
    ) -> None:
        if mode not in ("lenient", "boxed"):
            raise ValueError(f"math mode must be 'lenient' or 'boxed', got {mode!r}")
        # Imported here so that importing rlvr_core.verifiers stays cheap (sympy takes ~1 s).
        import math_verify
        import math_verify.grader
        import math_verify.parser

        # Its own (wall-clock) timeouts are off on purpose, limited by `cpu_time_limit` instead: mark its
        # one-time "timeout is disabled" warning as shown.
        math_verify.grader.TIMEOUT_WARNING_SHOWN = math_verify.parser.TIMEOUT_WARNING_SHOWN = True
        self._mv = math_verify
        self.mode = mode
        self.format_reward = format_reward
        self.float_rounding = float_rounding
        self.numeric_precision = numeric_precision
        self.time_limit_s = time_limit_s
        # Parsed golds, most recently used last. A GRPO batch checks G responses against each gold,
        # and parsing one costs milliseconds. Golds parsed since the last `take_parsed_golds` are
        # kept aside so a verification pool can pass them on to its other workers.
        self._golds: OrderedDict[str, tuple[Any, ...]] = OrderedDict()
        self._fresh: deque[tuple[str, tuple[Any, ...]]] = deque(maxlen=_GOLD_CACHE)
        self._gold_lock = threading.Lock()  # one verifier may be shared by threads

    def set_time_limit(self, seconds: float) -> None:
        self.time_limit_s = seconds

    def warm_up(self) -> None:
        """Build the LaTeX grammar, sympy's caches and its lazily imported submodules (a fresh process
        verifies about twice as slowly otherwise; `MATH_EXAMPLES`)."""
        for gold, answer in MATH_EXAMPLES:
            for response in (f"The answer is $\\boxed{{{answer}}}$.", f"So we get ${answer}$."):
                try:
                    self.verify(response, gold)
                except Exception:  # noqa: BLE001 — only the side effects matter here
                    pass

    # ------------------------------------------------------------------ parsing
    def _parse(self, text: str) -> list[Any]:
        return self._mv.parse(text, parsing_timeout=None, raise_on_error=True)

    def _parse_gold(self, gold: str) -> tuple[Any, ...]:
        with self._gold_lock:
            parsed = self._golds.get(gold)
            if parsed is not None:
                self._golds.move_to_end(gold)
                return parsed
        parsed = self._parse_gold_uncached(gold)  # outside the lock: it can take a while
        self.add_parsed_gold(gold, parsed)
        self._fresh.append((gold, parsed))
        return parsed

    def add_parsed_gold(self, gold: str, parsed: tuple[Any, ...]) -> None:
        """Cache a gold parsed elsewhere (by another pool worker), so it is not parsed again here."""
        with self._gold_lock:
            self._golds[gold] = parsed
            self._golds.move_to_end(gold)
            if len(self._golds) > _GOLD_CACHE:
                self._golds.popitem(last=False)

    def take_parsed_golds(self) -> list[tuple[str, tuple[Any, ...]]]:
        """The golds this verifier parsed itself since the last call (for the pool to share)."""
        with self._gold_lock:
            out = list(self._fresh)
            self._fresh.clear()
        return out

    def _parse_gold_uncached(self, gold: str) -> tuple[Any, ...]:
        boxed = last_boxed(gold) if ("\\boxed" in gold or "\\fbox" in gold) else None
        answer = boxed if boxed is not None else gold.strip()
        parsed = self._parse("\\boxed{" + answer + "}")
        if not parsed:
            raise ValueError(f"math-verify could not parse the gold answer {answer!r}")
        return tuple(parsed)

    def extract(self, response: str) -> list[Any]:
        """math-verify's parse of the answer: [sympy object, source string], or [] when none."""
        if self.mode == "boxed":
            content = last_boxed(response)
            return [] if content is None else self._parse("\\boxed{" + content + "}")
        return self._parse(response)

    # ------------------------------------------------------------------ verify
    def verify(self, response: str, gold: Any) -> Outcome:
        if not isinstance(response, str):
            raise TypeError(f"response must be str, got {type(response).__name__}")
        if isinstance(gold, bool) or not isinstance(gold, (str, int, float)):
            raise TypeError(f"math gold must be text or a number, got {type(gold).__name__}")
        try:
            with cpu_time_limit(self.time_limit_s):
                return self._verify(response, str(gold))
        except VerifierTimeout as exc:
            return Outcome(Status.TIMEOUT, 0.0, None, self.name, self.version, f"time limit: {exc}")

    def _verify(self, response: str, gold: str) -> Outcome:
        formatted = last_boxed(response) is not None
        gold_parsed = self._parse_gold(gold)
        pred = self.extract(response)
        if not pred:
            return Outcome(Status.NO_ANSWER, 0.0, None, self.name, self.version, f"mode={self.mode}")
        extracted = str(pred[-1]) if isinstance(pred[-1], str) else str(pred[0])

        # Each (gold, pred) candidate pair on its own, as math-verify's verify does with any(), but
        # keeping the first error instead of swallowing it.
        first_error: BaseException | None = None
        for g in gold_parsed:
            for t in pred:
                try:
                    ok = self._mv.verify(
                        g, t,
                        float_rounding=self.float_rounding,
                        numeric_precision=self.numeric_precision,
                        timeout_seconds=None,
                        raise_on_error=True,
                    )
                except Exception as exc:  # noqa: BLE001 — kept and reported below
                    first_error = first_error or exc
                    continue
                if ok:
                    reward = shaped_reward(True, formatted, self.format_reward)
                    return Outcome(Status.CORRECT, reward, extracted, self.name, self.version, f"mode={self.mode}")
        if first_error is not None:
            return Outcome(
                Status.ERROR, 0.0, extracted, self.name, self.version,
                f"{type(first_error).__name__}: {first_error}",
            )
        reward = shaped_reward(False, formatted, self.format_reward)
        return Outcome(Status.INCORRECT, reward, extracted, self.name, self.version, f"mode={self.mode}")
