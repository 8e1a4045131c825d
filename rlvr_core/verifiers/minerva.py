"""Minerva MATH: lm-evaluation-harness' ``minerva_math`` ``exact_match``, so our numbers line up with theirs.

Their metric, which we follow step by step (lm_eval/tasks/minerva_math/utils.py):

1. The prediction is the text between ``Final Answer: The final answer is`` and
   ``. I hope it is correct.`` (the 4-shot Minerva format); if absent, ``[invalidanswer]``.
2. Gold is the last ``\\boxed{}`` of the reference solution (or the bare answer we are given).
3. Both go through ``normalize_final_answer`` (Lewkowycz et al. 2022, appendix D): keep the part
   after the last ``=``, a fixed list of substitutions and removed words (units, "dollars", …),
   unwrap ``$…$``, ``\\text{}``, ``\\textbf{}``, ``\\overline{}``, ``\\boxed{}``, fix ``\\fracab`` and
   ``\\sqrta``, drop thousands commas of integers.
4. ``is_equiv``: identical normalised strings are equal (lm-eval 0.4.13); otherwise parse both LaTeX
   strings, and the answer is right iff ``simplify(a - b) == 0``; an unparseable answer scores 0.

Where we differ, and why:

- lm-eval parses with ``sympy.parsing.latex.parse_latex``, which needs ``antlr4-python3-runtime``
  4.11. math-verify pins 4.13 (through ``latex2sympy2_extended``), so the two cannot live in one
  environment. We parse with ``latex2sympy2_extended`` instead: a fork of the same ANTLR grammar.
  Both return sympy expressions; on exotic LaTeX they can disagree (see docs/verifiers.md).
- Statuses: ``[invalidanswer]`` is ``no_answer``; an answer that does not parse is ``incorrect``
  (lm-eval scores it 0, and that is the semantics we promise) with ``detail`` saying so; an
  *unexpected* exception is ``error``; lm-eval's 5-s wall-clock alarm becomes a CPU-time limit
  (``time_limit_s``, set by the pool to its timeout; main thread only, the pool's kill covers the
  rest) reported as ``timeout``.
"""

from __future__ import annotations

import re
from typing import Any

from rlvr_core.verifiers.base import Outcome, Status, register_verifier, shaped_reward
from rlvr_core.verifiers.limits import VerifierTimeout, cpu_time_limit
from rlvr_core.verifiers.final_answer import last_boxed
from rlvr_core.verifiers.math_verifier import MAX_ANSWER_CHARS, MAX_NESTING, nesting_depth

INVALID_ANSWER = "[invalidanswer]"
_FINAL = re.compile(r"Final Answer: The final answer is(.*?). I hope it is correct.", re.DOTALL)

# Lewkowycz et al. (2022), appendix D; order matters (applied in sequence).
SUBSTITUTIONS = [
    ("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), (r"\ ", ""), (" ", ""),
    ("mbox", "text"), (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"),
]
REMOVED_EXPRESSIONS = [
    "square", "ways", "integers", "dollars", "mph", "inches", "ft", "hours", "km", "units",
    "\\ldots", "sue", "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm",
    "pounds", "meters", "meals", "edges", "students", "childrentickets", "multiples",
    "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}",
    r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;", r",\!", "{,}", '"', "\\dots",
]


def get_unnormalized_answer(text: str) -> str:
    # The reference appends the end marker so an answer cut right before it still matches.
    m = _FINAL.search(text + "I hope it is correct.")
    return m.group(1).strip() if m else INVALID_ANSWER


def normalize_final_answer(answer: str) -> str:
    answer = answer.split("=")[-1]
    for before, after in SUBSTITUTIONS:
        answer = answer.replace(before, after)
    for expr in REMOVED_EXPRESSIONS:
        answer = answer.replace(expr, "")
    answer = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", answer)
    answer = re.sub(r"(\\text\{)(.*?)(\})", "\\2", answer)
    answer = re.sub(r"(\\textbf\{)(.*?)(\})", "\\2", answer)
    answer = re.sub(r"(\\overline\{)(.*?)(\})", "\\2", answer)
    answer = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", answer)
    answer = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", answer)
    answer = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer


class _ParseFailed(Exception):
    pass


@register_verifier("minerva")
class MinervaVerifier:
    name = "minerva"
    version = "2"  # 2: several different final answers score 0; equal strings are equal
    can_hang = True  # sympy.simplify

    def __init__(self, format_reward: float = 0.0, time_limit_s: float = 5.0) -> None:
        import sympy
        from latex2sympy2_extended import latex2sympy

        self._sympy = sympy
        self._latex2sympy = latex2sympy
        self.format_reward = format_reward
        self.time_limit_s = time_limit_s

    def set_time_limit(self, seconds: float) -> None:
        self.time_limit_s = seconds

    def warm_up(self) -> None:
        """latex2sympy's grammar and sympy's simplify machinery are built on first use."""
        for response, gold in (("Final Answer: The final answer is $\\frac{1}{2}$. I hope it is correct.", "0.5"),
                               ("Final Answer: The final answer is $2\\sqrt{3}$. I hope it is correct.", "\\sqrt{12}"),
                               ("Final Answer: The final answer is $x^2+1$. I hope it is correct.", "1+x^2")):
            self.verify(response, gold)

    def gold_answer(self, gold: Any) -> str:
        if isinstance(gold, bool) or not isinstance(gold, (str, int, float)):
            raise TypeError(f"minerva gold must be text or a number, got {type(gold).__name__}")
        text = str(gold)
        boxed = last_boxed(text) if ("\\boxed" in text or "\\fbox" in text) else None
        return normalize_final_answer(boxed if boxed is not None else text)

    def _parse(self, s: str) -> Any:
        try:
            return self._latex2sympy(s)
        except Exception as exc:  # noqa: BLE001 — the reference scores unparseable answers 0
            raise _ParseFailed(f"{type(exc).__name__}: {exc}") from exc

    def is_equiv(self, x1: str, x2: str) -> bool:
        """Identical normalised strings, else simplify(parse(x1) - parse(x2)) == 0; raises _ParseFailed
        when either does not parse. The string check comes first, as in lm-eval 0.4.13: without it a
        tuple, an interval or a time (``12:00`` is ``12/0``, and ``zoo - zoo`` is nan) identical to the
        gold scores 0."""
        if x1 and x1 == x2:
            return True
        a, b = self._parse(x1), self._parse(x2)
        try:
            diff = a - b
        except TypeError as exc:  # e.g. a tuple minus a number: the reference scores 0
            raise _ParseFailed(f"cannot subtract: {exc}") from exc
        return self._sympy.simplify(diff) == 0

    def verify(self, response: str, gold: Any) -> Outcome:
        if not isinstance(response, str):
            raise TypeError(f"response must be str, got {type(response).__name__}")
        target = self.gold_answer(gold)
        raw = get_unnormalized_answer(response)
        if raw == INVALID_ANSWER:
            return Outcome(Status.NO_ANSWER, 0.0, None, self.name, self.version, "no 'Final Answer: …' line")
        if len(raw) > MAX_ANSWER_CHARS or nesting_depth(raw) > MAX_NESTING:  # not an answer; see math_verifier
            return Outcome(Status.INCORRECT, 0.0, None, self.name, self.version,
                           f"the final answer is too long or too deeply nested ({len(raw)} characters)")
        answer = normalize_final_answer(raw)
        try:
            with cpu_time_limit(self.time_limit_s):
                ok = self.is_equiv(answer, target)
                other = self._other_answer(response, answer, target) if ok else None
        except VerifierTimeout as exc:
            return Outcome(Status.TIMEOUT, 0.0, answer, self.name, self.version, f"sympy simplify: {exc}")
        except _ParseFailed as exc:
            return Outcome(Status.INCORRECT, 0.0, answer, self.name, self.version,
                           f"unparseable, scored 0 as lm-eval does: {exc}", {"parse_failed": True})
        if other is not None:
            return Outcome(Status.INCORRECT, shaped_reward(False, True, self.format_reward), answer, self.name,
                           self.version, f"several final answers, and {other[:80]!r} is not the gold",
                           {"several_answers": True})
        reward = shaped_reward(ok, True, self.format_reward)
        return Outcome(Status.CORRECT if ok else Status.INCORRECT, reward, answer, self.name, self.version,
                       f"gold={target}")

    def _other_answer(self, response: str, first: str, target: str) -> str | None:
        """A later "Final Answer: …" line that is not the gold, or None. lm-eval reads only the first such
        line; we hold every one to the gold, so a response that states several answers scores 0."""
        for m in _FINAL.finditer(response + "I hope it is correct."):
            other = normalize_final_answer(m.group(1).strip())
            if other == first:
                continue
            try:
                if not self.is_equiv(other, target):
                    return other
            except _ParseFailed:
                return other
        return None
