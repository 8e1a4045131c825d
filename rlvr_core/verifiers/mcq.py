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
    version = "1"
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

    def extract(self, response: str) -> tuple[str | None, str]:
        """(letter or None, which rule matched)."""
        found = []
        for m in self._explicit.finditer(response):
            letter = m.group("x") or m.group("y")
            # "the answer is a bit tricky": a lower-case letter followed by more words is an article.
            if letter.islower() and re.match(r"\s+[A-Za-z]", response[m.end():]):
                continue
            if letter.upper() in self.letters:
                found.append(letter)
        if found:
            return found[-1].upper(), "explicit"
        m = self._alone.match(response.strip())
        if m:
            return m.group("x"), "alone"
        paren = self._paren.findall(response)
        if paren:
            return paren[-1], "parenthesised"
        return None, "none"

    def verify(self, response: str, gold: Any) -> Outcome:
        if not isinstance(response, str):
            raise TypeError(f"response must be str, got {type(response).__name__}")
        target = gold_letter(gold, self.letters)
        letter, rule = self.extract(response)
        if letter is None:
            return Outcome(Status.NO_ANSWER, 0.0, None, self.name, self.version, "no standalone letter")
        ok = letter == target
        reward = shaped_reward(ok, rule == "explicit", self.format_reward)
        return Outcome(Status.CORRECT if ok else Status.INCORRECT, reward, letter, self.name, self.version,
                       f"rule={rule}")
