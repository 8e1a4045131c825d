"""Token categories for the RL-Probe report: which kind of token does a KL spike sit on?

A token is classified from its own decoded text, with surrounding whitespace stripped. The first rule
that matches wins, in this order:

| category | rule (on the stripped text `s`) | examples |
|---|---|---|
| `number` | digits, optionally with `.` or `,` between digit groups (`^\\d+([.,]\\d+)*$`), or a digit-led fragment of a number (`^\\d[\\d.,]*$`) | `7`, `12`, `3.5`, `1,000` |
| `step_marker` | empty after stripping but contains a newline; `####`; a word among step, first, second, third, next, finally, lastly, answer (any case, optional trailing `:`/`.`); a numbered-step prefix like `1.` or `2)` | `\\n`, `####`, `Step`, `Finally` |
| `math_symbol` | only operator / relation / math characters `+ - * / = ^ < > % × ÷ − · √ ∑ ∏ ∫ ≤ ≥ ≠ ≈ ± ∞ \\| \\ _ $ ~`, or a LaTeX command (`\\frac`, `\\sqrt`, `\\cdot`, …) | `+`, ` =`, `\\frac`, `$` |
| `logical` | a connective word: so, therefore, thus, hence, because, since, then, if, and, or, not, but, however, implies, means, consequently, given, let, suppose, assume, otherwise, which, when, wait, all, each | `Therefore`, ` so` |
| `variable` | one Latin letter, optionally followed by digits or `_digits` (`x`, `y1`, `a_2`), or one Greek letter | ` x`, `n` |
| `punctuation` | only Unicode punctuation characters (category P*) | `.`, `,`, `(`, `?` |
| `other` | everything else: words, whitespace without a newline, special tokens, byte fragments | `apples`, `<|endoftext|>` |

Known ambiguities, kept on purpose so the rules stay simple and stable: the English words "a" and "I"
count as variables; `-` is a math symbol even when used as a hyphen; a token mixing classes (e.g. `7.`
with a trailing dot) falls to the first rule that matches its whole stripped text (`7.` is not a number
by the first rule, so it is a numbered step marker).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

__all__ = ["CATEGORIES", "categorize_text", "token_categories"]

CATEGORIES = ("number", "math_symbol", "variable", "punctuation", "logical", "step_marker", "other")

_NUMBER = re.compile(r"^(\d+([.,]\d+)*|\d[\d.,]*\d|\d)$")
_STEP_WORDS = {"step", "first", "second", "third", "next", "finally", "lastly", "answer"}
_STEP_PREFIX = re.compile(r"^\d+[.)]$")
_MATH_CHARS = set("+-*/=^<>%×÷−·√∑∏∫≤≥≠≈±∞|\\_$~")
_LATEX = re.compile(r"^\\[A-Za-z]+$")
_LOGICAL = {"so", "therefore", "thus", "hence", "because", "since", "then", "if", "and", "or", "not", "but",
            "however", "implies", "means", "consequently", "given", "let", "suppose", "assume", "otherwise",
            "which", "when", "wait", "all", "each"}
_VARIABLE = re.compile(r"^([A-Za-z](_?\d+)?|[\u0391-\u03a9\u03b1-\u03c9])$")


def categorize_text(text: str) -> str:
    """The category of one token's decoded text (see the module docstring for the rules)."""
    s = text.strip()
    if not s:
        return "step_marker" if "\n" in text else "other"
    if _NUMBER.match(s):
        return "number"
    low = s.lower().rstrip(":.")
    if s == "####" or low in _STEP_WORDS or _STEP_PREFIX.match(s):
        return "step_marker"
    if _LATEX.match(s) or all(c in _MATH_CHARS for c in s):
        return "math_symbol"
    if low in _LOGICAL:
        return "logical"
    if _VARIABLE.match(s):
        return "variable"
    if all(unicodedata.category(c).startswith("P") for c in s):
        return "punctuation"
    return "other"


def token_categories(tokenizer, token_ids: Iterable[int]) -> dict[int, tuple[str, str]]:
    """{token id: (decoded text, category)} for the distinct ids (each decoded once, specials kept)."""
    out: dict[int, tuple[str, str]] = {}
    for t in set(int(i) for i in token_ids):
        text = tokenizer.decode([t], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        out[t] = (text, categorize_text(text))
    return out
