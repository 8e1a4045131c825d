"""Multiple choice (ARC, MMLU, AQuA): find the chosen letter with word boundaries, compare with gold.

The classic bug is "the first capital letter in the response": "A good way to see this is … (C)"
reads as "A". We only accept a letter that stands alone (a word of its own: ``C``, ``(C)``,
``C)``, ``C.``, ``**C**``, ``\\boxed{C}``) and prefer explicit answer statements. In order:

1. an explicit statement: "answer is (C)", "Answer: C", "correct option is C", ``\\boxed{C}``
   (the last such statement wins: models restate and correct themselves);
2. the response *is* just a letter, maybe decorated: "C", "(C)", "C.", "C) 42";
3. the last letter in parentheses "(C)" anywhere.

A bare capital inside prose ("A car …", "I think") is never taken. If none of these match:
``no_answer``. Letters are limited to the options (``letters``, default A–E); lower-case letters
only count inside the explicit statements of step 1.

Gold: a letter ("C"), a 0-based index (MMLU's ``answer`` field: 2 or "2"), or an AQuA-style option
string "C)…" whose first character is the letter.
"""

from __future__ import annotations

import re
from typing import Any

from rlvr_core.verifiers.base import Outcome, Status, register_verifier, shaped_reward


# Between the letters of a list: a comma, slash, ampersand or semicolon, "and"/"or", or just spaces.
_SEPARATOR = r"\s*(?:[,/&;]\s*)?(?:\b(?:and|or)\b\s*)?"


def _item(letters: str) -> str:
    """One option letter standing alone as a word, maybe in parentheses or bold: "C", "(C)", "**C**"."""
    return r"(?<![\w])(?:\*\*)?\(?" + letters + r"\)?(?:\*\*)?(?![\w])"


def gold_letter(gold: Any, letters: str) -> str:
    if isinstance(gold, bool):
        raise TypeError(f"mcq gold must be a letter or an index, got bool {gold!r}")
    if isinstance(gold, int) or (isinstance(gold, str) and gold.strip().isdigit()):
        idx = int(gold)
        if not 0 <= idx < len(letters):
            raise ValueError(f"mcq gold index {idx} out of range for options {letters}")
        return letters[idx]
    if isinstance(gold, str):
        g = gold.strip().strip("()").strip()
        if g and g[0].upper() in letters and (len(g) == 1 or not g[1].isalpha()):
            return g[0].upper()
    raise ValueError(f"mcq gold is not a letter in {letters} or an index: {gold!r}")


@register_verifier("mcq")
class MCQVerifier:
    name = "mcq"
    version = "2"  # 2: a letter inside a list of letters scores 0
    # Regexes without nested quantifiers over the response: no input makes it run long
    # (tests/verifiers/test_verifier_limits.py feeds it adversarial megabyte responses).
    can_hang = False

    def warm_up(self) -> None:  # its regexes are compiled in __init__
        pass

    def __init__(self, letters: str = "ABCDE", format_reward: float = 0.0) -> None:
        if not letters.isalpha() or not letters.isupper():
            raise ValueError(f"letters must be upper-case letters, got {letters!r}")
        self.letters = letters
        self.format_reward = format_reward
        L = f"[{letters}]"
        Lc = f"[{letters}{letters.lower()}]"
        # 1. explicit statements; the letter must end there (not the start of a word).
        self._explicit = re.compile(
            r"(?:answer|option|choice)(?:\s+is)?(?:\s*:)?\s*(?:is\s*)?[\*\s]*[\(\[]?(?P<x>" + Lc + r")(?![\w])"
            r"|\\boxed\{\s*(?:\\text\{)?\s*\(?(?P<y>" + Lc + r")\)?\s*\}?\s*\}",
            re.IGNORECASE,
        )
        # 2. the whole response is one letter, maybe decorated and followed by the option text.
        self._alone = re.compile(r"^\W*(?P<x>" + L + r")(?:[\)\].:]|\s*$)")
        # 3. a letter in parentheses anywhere.
        self._paren = re.compile(r"\((?P<x>" + L + r")\)")
        # Several letters given as one answer: "A, B, C and D", "A or B", "(A)(B)", "B/C".
        self._lists = {case: re.compile(item + r"(?:" + _SEPARATOR + item + r")+")
                       for case, item in (("upper", _item(L)), ("any", _item(Lc)))}

    def extract(self, response: str) -> tuple[str | None, str]:
        """(letter or None, which rule matched)."""
        letter, rule, _ = self._find(response)
        return letter, rule

    def _find(self, response: str) -> tuple[str | None, str, int]:
        """(letter or None, which rule matched, where the letter stands in the response)."""
        found = []
        for m in self._explicit.finditer(response):
            group = "x" if m.group("x") else "y"
            letter = m.group(group)
            # "the answer is a bit tricky": a lower-case letter followed by more words is an article.
            if letter.islower() and re.match(r"\s+[A-Za-z]", response[m.end():]):
                continue
            if letter.upper() in self.letters:
                found.append((letter, m.start(group)))
        if found:
            letter, pos = found[-1]
            return letter.upper(), "explicit", pos
        stripped = response.strip()
        m = self._alone.match(stripped)
        if m:
            return m.group("x"), "alone", response.find(stripped) + m.start("x")
        paren = list(self._paren.finditer(response))
        if paren:
            return paren[-1].group("x"), "parenthesised", paren[-1].start("x")
        return None, "none", -1

    def several_statements(self, response: str) -> str | None:
        """The letters of "answer is X" / ``\\boxed{X}`` statements when they name different options
        ("The answer is A. The answer is B."), else None. "Option A is wrong" is reasoning, not counted."""
        letters = set()
        for m in self._explicit.finditer(response):
            letter = m.group("x") or m.group("y")
            if letter.islower() and re.match(r"\s+[A-Za-z]", response[m.end():]):
                continue
            if re.match(r"(?i)answer|\\boxed", m.group(0)) and letter.upper() in self.letters:
                letters.add(letter.upper())
        return ", ".join(sorted(letters)) if len(letters) > 1 else None

    def several_letters(self, response: str, pos: int) -> str | None:
        """The list of letters the chosen one stands in ("A, B, C and D"), or None when it stands alone.

        The rule: an answer that names several options is wrong whichever of them is the gold (the
        graders we follow take the first or the last letter, so naming them all would always win)."""
        case = "any" if response[pos].islower() else "upper"
        line_start = response.rfind("\n", 0, pos) + 1
        line_end = response.find("\n", pos)
        line = response[line_start:] if line_end < 0 else response[line_start:line_end]
        for m in self._lists[case].finditer(line):
            if m.start() <= pos - line_start < m.end():
                letters = {c.upper() for c in re.findall(r"[A-Za-z]", m.group(0)) if c.upper() in self.letters}
                return m.group(0) if len(letters) > 1 else None
        return None

    def verify(self, response: str, gold: Any) -> Outcome:
        if not isinstance(response, str):
            raise TypeError(f"response must be str, got {type(response).__name__}")
        target = gold_letter(gold, self.letters)
        letter, rule, pos = self._find(response)
        if letter is None:
            return Outcome(Status.NO_ANSWER, 0.0, None, self.name, self.version, "no standalone letter")
        listed = self.several_letters(response, pos) or self.several_statements(response)
        if listed is not None:
            return Outcome(Status.INCORRECT, shaped_reward(False, rule == "explicit", self.format_reward), letter,
                           self.name, self.version, f"several options given: {listed!r}", {"several_answers": True})
        ok = letter == target
        reward = shaped_reward(ok, rule == "explicit", self.format_reward)
        return Outcome(Status.CORRECT if ok else Status.INCORRECT, reward, letter, self.name, self.version,
                       f"rule={rule}")
