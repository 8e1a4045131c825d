"""MATH-style answers: extract, normalise and compare symbolically, on top of math-verify.

We do not write a CAS or a LaTeX parser: math-verify (Hugging Face, 0.9.0) already extracts answers
(``\\boxed{}`` with nesting, "final answer is …", the last ``$…$``, plain expressions), normalises
them (units, ``\\text{}``, ``\\left(``, malformed ``\\frac12``) and compares them with sympy
(numeric, symbolic, sets, intervals, matrices). What we add, and where we differ from a plain
``verify(parse(gold), parse(response))`` loop:

1. **Errors are errors, wrong answers are wrong.** math-verify by default catches every exception and
   returns ``False`` (or an empty parse), so a broken *gold* would silently make every answer
   "incorrect" (BUGZOO G-verifier-error). We call it with ``raise_on_error=True``: a gold that does not
   parse raises (an ``error`` outcome). A *prediction* that does not parse, or whose comparison with
   the gold raises (``1:00`` is ``1/0``: "Can't evaluate nan or zoo"), is ``incorrect`` with the
   message in ``extra`` (``parse_failed`` / ``compare_error``): the verifier worked, the answer is wrong.
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

5. **The final answer, one answer.** What is graded is the response's final answer (`final_answer.py`: the
   last box with the boxes joined to it, or a later "final answer" statement); a closing sentence that offers
   several different answers (two boxes, "3 or 4") is ``incorrect`` unless every one of them verifies
   (`_rival`; docs/verifiers.md, "Reward hacks (answers)" and "The final answer"). ``\\mathrm{e}``,
   ``\\mathrm{i}``, ``\\operatorname{lcm}`` are rewritten to ``e``, ``i``, ``\\lcm`` first (`plain_letters`).

Gold may be a bare answer (MATH-500's ``answer`` field, e.g. ``\\left( 3, \\frac{\\pi}{2} \\right)``)
or a full solution containing ``\\boxed{…}``; for the latter we take the last box, as the MATH
graders do. A bare answer is wrapped in ``\\boxed{}`` before parsing so math-verify reads it as one
LaTeX answer rather than hunting for the last number inside it.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict, deque
from typing import Any

from rlvr_core.verifiers.base import Outcome, Status, register_verifier, shaped_reward
from rlvr_core.verifiers.final_answer import FinalAnswer, alternatives, final_answer, gold_answer, last_boxed
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
# More distinct answers than this in one response is spraying, scored 0 without parsing each one.
MAX_ANSWERS = 8
# A final answer longer than this is not an answer (the longest MATH-500 and Minerva gold answer has 53): scored 0
# without parsing, so a crafted one cannot spend the CPU limit and more in the parser.
MAX_ANSWER_CHARS = 1000
# Brackets nested deeper than this are not an answer either: the parser's regexes and recursion on such a
# nest can run for a minute inside C code, where the CPU-time limit (a signal) cannot stop them.
MAX_NESTING = 100


def nesting_depth(text: str) -> int:
    """The deepest nesting of (), [] and {} in `text` (brackets of any kind counted together)."""
    depth = deepest = 0
    for ch in text:
        if ch in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]}":
            depth = max(depth - 1, 0)
    return deepest


# Upright letters and named operators that math-verify's normaliser would otherwise treat as text or
# units (``1-\\frac{1}{\\mathrm{e}}`` lost its ``e``): rewritten to the plain forms it parses.
_UPRIGHT_LETTER = re.compile(r"\\(?:mathrm|rm|mathit|textrm|text)\s*\{\s*([ei])\s*\}")
_OPERATOR_NAME = re.compile(r"\\operatorname\*?\s*\{\s*([A-Za-z]+)\s*\}")


def plain_letters(latex: str) -> str:
    """``\\mathrm{e}`` → ``e``, ``\\mathrm{i}`` → ``i``, ``\\operatorname{lcm}`` → ``\\lcm``."""
    return _OPERATOR_NAME.sub(r"\\\1", _UPRIGHT_LETTER.sub(r"\1", latex))


@register_verifier("math")
class MathVerifier:
    name = "math"
    # 2: several different answers score 0; wrong-but-parseable is incorrect, not error. 3: the final answer is
    # graded (final_answer.py): boxes split over one answer joined, blank boxes and earlier boxes ignored.
    version = "3"
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
        boxed = gold_answer(gold) if ("\\boxed" in gold or "\\fbox" in gold) else None
        answer = plain_letters(boxed if boxed is not None else gold.strip())
        parsed = self._parse("\\boxed{" + answer + "}")
        if not parsed:
            raise ValueError(f"math-verify could not parse the gold answer {answer!r}")
        return tuple(parsed)

    def extract(self, response: str, final: FinalAnswer | None = None) -> list[Any]:
        """math-verify's parse of the final answer (`final_answer`): [sympy object, source string], or [].

        A final answer in boxes is read as LaTeX only, in both modes: math-verify would otherwise fall back to the
        last bare number inside a box it cannot parse, so ``\\boxed{\\{1, 2, \\ldots, 42\\}}`` read as 42. With no
        box, lenient mode uses math-verify's whole extraction and boxed mode finds no answer."""
        final = final if final is not None else final_answer(response, statements=self.mode == "lenient")
        if final is None:
            return [] if self.mode == "boxed" else self._parse(response)
        if len(final.text) > MAX_ANSWER_CHARS:
            raise ValueError(f"the final answer has {len(final.text)} characters (more than {MAX_ANSWER_CHARS})")
        if final.from_boxes:
            return self._parse_box(final.text)
        # A "final answer" sentence that states nothing ("This is our final answer.") leaves the boxes as the answer.
        return self._parse(final.text) or self.extract(response, final_answer(response, statements=False))

    def _parse_box(self, content: str) -> list[Any]:
        return self._mv.parse("\\boxed{" + content + "}", extraction_config=[self._mv.LatexExtractionConfig()],
                              parsing_timeout=None, raise_on_error=True)

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
        response = plain_letters(response)
        formatted = last_boxed(response) is not None
        gold_parsed = self._parse_gold(gold)
        if nesting_depth(response) > MAX_NESTING:
            return self._wrong(formatted, None, f"brackets nested deeper than {MAX_NESTING}: not an answer, scored 0",
                               {"too_deep": True})
        final = final_answer(response, statements=self.mode == "lenient")
        if final is not None and final.count + len(final.closing) > MAX_ANSWERS:
            return self._wrong(formatted, None, f"{final.count + len(final.closing)} answers in the closing statement",
                               {"several_answers": True})
        try:
            pred = self.extract(response, final)
        except Exception as exc:  # noqa: BLE001 — the answer, not the verifier, is broken
            return self._wrong(formatted, None, f"unparseable answer, scored 0: {type(exc).__name__}: {exc}",
                               {"parse_failed": True})
        if not pred:
            return Outcome(Status.NO_ANSWER, 0.0, None, self.name, self.version, f"mode={self.mode}")
        extracted = str(pred[-1]) if isinstance(pred[-1], str) else str(pred[0])
        ok, error = self._matches(gold_parsed, pred)
        if ok:
            rival = None if _is_set(pred[0]) else self._rival(response, gold_parsed, final)
            if rival is not None:
                return self._wrong(formatted, extracted, f"several answers, and {rival[:80]!r} is not the gold",
                                   {"several_answers": True})
            reward = shaped_reward(True, formatted, self.format_reward)
            return Outcome(Status.CORRECT, reward, extracted, self.name, self.version, f"mode={self.mode}")
        if error is not None:
            # Both sides parsed but the values cannot be compared (nan, zoo, a set against a matrix):
            # the answer is not shown equal to the gold, so it scores 0; the message stays in `extra`.
            message = f"{type(error).__name__}: {error}"
            return self._wrong(formatted, extracted, f"not comparable with the gold, scored 0: {message}",
                               {"compare_error": message})
        return self._wrong(formatted, extracted, f"mode={self.mode}")

    def _wrong(self, formatted: bool, extracted: str | None, detail: str, extra: dict | None = None) -> Outcome:
        reward = shaped_reward(False, formatted, self.format_reward)
        return Outcome(Status.INCORRECT, reward, extracted, self.name, self.version, detail, extra or {})

    def _matches(self, gold_parsed: tuple[Any, ...], pred: list[Any]) -> tuple[bool, BaseException | None]:
        """(some (gold, pred) candidate pair is equal, the first exception a pair raised).

        Each pair on its own, as math-verify's verify does with any(), but keeping the first error
        instead of swallowing it."""
        first_error: BaseException | None = None
        for g in gold_parsed:
            for t in pred:
                try:
                    if self._mv.verify(g, t, float_rounding=self.float_rounding,
                                       numeric_precision=self.numeric_precision,
                                       timeout_seconds=None, raise_on_error=True):
                        return True, None
                except Exception as exc:  # noqa: BLE001 — returned to the caller
                    first_error = first_error or exc
        return False, first_error

    def _rival(self, response: str, gold_parsed: tuple[Any, ...], final: FinalAnswer | None) -> str | None:
        """A second stated answer that is not the gold: another box of the closing sentence, or an alternative
        joined by "or" in the answer statement.

        The rule: a response whose final statement offers several answers is correct only if every one of them
        is (a grader that read one of them would pay for listing candidates). Restating the same value
        (``\\boxed{1/2}``, that is ``\\boxed{0.5}``) still counts; boxes earlier in the reasoning are not answers."""
        closing = list(final.closing) if final is not None else []
        for candidate in closing:
            try:
                parsed = self._parse_box(candidate)
            except Exception:  # noqa: BLE001 — an unparseable second answer is not the gold
                return candidate
            if parsed and not self._matches(gold_parsed, parsed)[0]:
                return candidate
        for candidate in alternatives(response):
            try:
                parsed = self._parse(candidate)
            except Exception:  # noqa: BLE001
                return candidate
            if parsed and not self._matches(gold_parsed, parsed)[0]:
                return candidate
        return None


def _is_set(value: Any) -> bool:
    """math-verify joined several stated values into one set ("$3$ or $4$"); its set comparison then
    demands exactly the gold's elements, so no further check is needed."""
    import sympy

    return isinstance(value, sympy.FiniteSet)
