"""Where a response states its answer: the final answer is what is graded.

The final answer of a response is
- its last box (``\\boxed{…}``, ``\\fbox{…}``), with the boxes right before it that only commas, "and", spacing
  or math delimiters separate (``\\boxed{1}, \\boxed{2}`` for a set or a tuple split over boxes: one answer,
  ``1, 2``), boxes that hold no answer (empty, ``\\phantom{…}``, ``?``: a problem's own blank) ignored;
- unless an explicit "final answer" statement follows that box (``\\boxed{255}`` in the reasoning, then "The
  final answer is $10,455$"): then that statement.
Boxes earlier in the reasoning are not answers. What stays a hedge: several different answers in the closing
sentence (``\\boxed{3}`` or ``\\boxed{4}``: the boxes of that sentence outside the final answer, `closing`), "or"
between candidates in the answer statement (`alternatives`), and a final answer that is itself a set or interval
containing the gold (compared as a set by math-verify). docs/verifiers.md, "The final answer", has the measurements.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

def _box_content(text: str, idx: int) -> str | None:
    """Content of the box whose command starts at `idx` (braces balanced), None when it never closes."""
    found = _box_span(text, idx)
    return None if found is None else found[0]


def _box_span(text: str, idx: int) -> tuple[str, int] | None:
    """(content, end offset) of the box whose command starts at `idx`; None when it never closes."""
    head = "\\boxed" if text.startswith("\\boxed", idx) else "\\fbox"
    start = idx + len(head)
    if text.startswith(" ", start):  # "\boxed 5": the answer runs to the next "$" or end of line
        content = text[start + 1:].split("$")[0].split("\n")[0]
        return (content.strip(), start + 1 + len(content)) if content.strip() else None
    if not text.startswith("{", start):
        return None
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1:i], i + 1
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{…}`` (or ``\\fbox{…}``, or ``\\boxed 5``), braces balanced.

    Same contract as ``last_boxed_only_string`` + ``remove_boxed`` in the Hendrycks MATH and
    lm-evaluation-harness graders, written as one brace-counting scan. None when there is no box or
    its braces never close.
    """
    idx = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    return None if idx < 0 else _box_content(text, idx)


_BOX_START = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


def all_boxed(text: str) -> list[str]:
    """The contents of every box in `text`, in order (a box inside a box counts too)."""
    return [c for m in _BOX_START.finditer(text) if (c := _box_content(text, m.start())) is not None]


# A final statement that offers alternatives: "3 or 4", "$x=3$ or $x=5$", "1/2, or equivalently 0.5".
_ANCHOR = re.compile(r"(?i)answer|final|\\boxed|\\fbox")
_SENTENCE_END = re.compile(r"[.!?](?=\s|$)|\n")
_OR_AFTER_BOX = re.compile(r"\$?\s*,?\s*\bor\b(?!\s*not\b)")
_OR = re.compile(r"(?<=[\w$})\]])(\s*,?\s*)\bor\b(?!\s*not\b)(?=\s*[-\w$\\(\[{])")


def final_statement(response: str) -> str:
    """The sentence that states the answer: from the last anchor ("answer", "final", a box), else the
    last non-empty line, up to the end of that sentence. Only that sentence is searched for "or", so
    reasoning before it ("x = 3 or x = -3, so the sum is \\boxed{0}") is not taken for a hedge."""
    anchors = list(_ANCHOR.finditer(response))
    if anchors:
        text = response[anchors[-1].start():]
    else:
        lines = [ln for ln in response.splitlines() if ln.strip()]
        text = lines[-1] if lines else ""
    end = _SENTENCE_END.search(text)
    return text if end is None else text[:end.end()]


def alternatives(response: str) -> list[str]:
    """The answer statement cut at each "or" that joins two candidates ([] when it has none). After a
    box only an "or" right behind it counts (``\\boxed{3}, or 4``): the rest of that sentence is often
    reasoning ("\\boxed{49} has a remainder of 1 when divided by 2, 3, 4, or 6")."""
    statement = final_statement(response)
    box = _BOX_START.match(statement)
    if box:
        content = _box_content(statement, 0)
        end = box.end() + len(content or "") + 2 if statement[box.end():].startswith("{") else len(statement)
        if content is None or not _OR_AFTER_BOX.match(statement, end):
            return []
        return [statement[:end], statement[_OR_AFTER_BOX.match(statement, end).end():]]
    if not _OR.search(statement):
        return []
    return [part for part in _OR.split(statement)[::2] if part.strip()]



@dataclass(frozen=True)
class Box:
    start: int  # offset of the box command
    end: int  # offset just past its closing brace
    content: str


# What a box holds when it holds no answer: nothing, spacing, a \phantom, a question mark.
_NO_ANSWER = re.compile(r"\\[hv]?phantom\s*\{[^{}]*\}|\\q?quad|\\[,;:! ]|\\text\s*\{\s*\}|~|\s")


def holds_answer(content: str) -> bool:
    return _NO_ANSWER.sub("", content) not in ("", "?")


def boxes(text: str) -> list[Box]:
    """The top-level boxes of `text` that hold an answer, in order (a box inside another is part of it)."""
    out: list[Box] = []
    for m in _BOX_START.finditer(text):
        if out and m.start() < out[-1].end:
            continue
        found = _box_span(text, m.start())
        if found is not None and holds_answer(found[0]):
            out.append(Box(m.start(), found[1], found[0]))
    return out


# What may stand between the boxes of one answer: spacing, math delimiters, commas, semicolons, "and" (also in a
# \text{…} label: "\text{ for part (a) and }"), and a name before the next box ("y_1 = \boxed{…} and
# y_2 = \boxed{…}"). Not "or": that is a hedge. Joined boxes are one answer, a set or tuple, so a hedge joined in
# is compared as a set and fails against a single gold.
_JOINER = re.compile(r"(?:\s|\$|\\[()\[\]]|\\\\|\\q?quad(?![A-Za-z])|\\[,;:! ]|[,;&]|\band\b"
                     r"|\\text\s*\{\s*,?\s*\}|\\text\s*\{(?![^{}]*\bor\b)[^{}]*\band\b[^{}]*\}"
                     r"|[A-Za-z](?:_\{?\w+\}?)?\s*=)*")


def final_group(text: str, also: re.Pattern | None = None) -> list[Box]:
    """The last box and the boxes before it that only joiners (or `also`) separate from it ([] when there is no
    box)."""
    found = boxes(text)
    if not found:
        return []
    group = [found[-1]]
    for box in reversed(found[:-1]):
        if not (_JOINER.fullmatch(text, box.end, group[0].start)
                or (also is not None and also.fullmatch(text, box.end, group[0].start))):
            break
        group.insert(0, box)
    return group


_FINAL_STATEMENT = re.compile(r"(?i)\bfinal answer\b")


def _sentence_bounds(text: str, start: int, end: int) -> tuple[int, int]:
    """The sentence around text[start:end]: from the last sentence end before `start` to the first after `end`."""
    before = [m.end() for m in _SENTENCE_END.finditer(text, 0, start)]
    after = _SENTENCE_END.search(text, end)
    return (before[-1] if before else 0), (after.end() if after else len(text))


@dataclass(frozen=True)
class FinalAnswer:
    text: str  # what is parsed: a box's content (a group's contents joined by ", "), or a statement
    from_boxes: bool  # boxes are parsed as LaTeX only; a statement with math-verify's whole extraction
    count: int  # distinct boxes in the final answer
    closing: tuple[str, ...]  # other boxes of the closing sentence (each must equal the gold too)


# Between two boxes of a gold answer, besides the joiners: a few words with "and" ("\\boxed{1} papers and \\boxed{2}
# bins"); a gold is trusted, so its words are labels, not hedges.
_GOLD_JOINER = re.compile(r"(?![^.!?\n]*\bor\b)[^.!?\n]{0,40}\band\b[^.!?\n]{0,40}")


def gold_answer(gold: str) -> str | None:
    """The answer of a gold solution: its final group of boxes (`final_group`, words with "and" also joining),
    joined; None without a box."""
    group = final_group(gold, _GOLD_JOINER)
    return ", ".join(dict.fromkeys(box.content.strip() for box in group)) if group else None


def final_answer(response: str, statements: bool = True) -> FinalAnswer | None:
    """The final answer of `response` (module docstring); None when it has no box holding an answer. With
    `statements=False` only boxes count (the strict `boxed` mode, and golds)."""
    group = final_group(response)
    if not group:
        return None
    if statements:
        later = [m for m in _FINAL_STATEMENT.finditer(response, group[-1].end)]
        if later:  # the statement runs to the end of its sentence
            start = later[-1].start()
            end = _SENTENCE_END.search(response, later[-1].end())
            return FinalAnswer(response[start:end.end() if end else len(response)], False, 1, ())
    contents = list(dict.fromkeys(box.content.strip() for box in group))
    start, end = _sentence_bounds(response, group[0].start, group[-1].end)
    inside = set(contents)
    closing = tuple(dict.fromkeys(b.content.strip() for b in boxes(response)[:-len(group)]
                                  if b.start >= start and b.end <= end and b.content.strip() not in inside))
    return FinalAnswer(", ".join(contents), True, len(contents), closing)

