"""Synthetic arithmetic word problems in GSM8K form, for the tiny model of the walking skeleton.

Each problem is a short story about one person's collection of items, changed step by step
("buys 4 more", "gives 2 to Ann", "ends up with 3 times as many"); the worked answer has one line
per step, ``a + b = c``, and ends with ``#### N`` exactly like GSM8K::

    Question: Tom has 3 apples. He buys 4 more. Then he gives 2 to Ann. How many apples does Tom have now?
    Answer: 3 + 4 = 7
    7 - 2 = 5
    #### 5

Everything is drawn from one ``random.Random`` seeded by (seed, difficulty), so a spec always gives
the same rows. The test split is drawn first and does not depend on ``n_train``; the train split skips
every question that is already in the test split, so the two are disjoint by question text.

``difficulty`` turns up the number sizes, the number of steps, and (from 3 on) adds multiplication;
see ``_LEVELS`` and ``docs/tiny_model.md``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["SyntheticSpec", "make_synthetic_dataset", "level_for", "ProductsSpec", "make_products_dataset",
           "tool_answer"]


@dataclass(frozen=True)
class SyntheticSpec:
    """All knobs of the synthetic data set. ``difficulty`` >= 1 turns up number sizes / steps."""

    n_train: int = 2000
    n_test: int = 200
    seed: int = 0
    difficulty: int = 1


@dataclass(frozen=True)
class _Level:
    max_num: int  # operands (and the starting amount) are drawn from 1..max_num
    min_steps: int
    max_steps: int
    ops: tuple[str, ...]  # subset of "+", "-", "*"
    max_factor: int = 3  # for "*": factor drawn from 2..max_factor


# Difficulty table; levels beyond the table grow the numbers and the steps further.
_LEVELS: dict[int, _Level] = {
    1: _Level(max_num=9, min_steps=2, max_steps=2, ops=("+", "-")),
    2: _Level(max_num=20, min_steps=2, max_steps=3, ops=("+", "-")),
    3: _Level(max_num=30, min_steps=3, max_steps=3, ops=("+", "-", "*"), max_factor=3),
    4: _Level(max_num=50, min_steps=3, max_steps=4, ops=("+", "-", "*"), max_factor=5),
}


def level_for(difficulty: int) -> _Level:
    if difficulty < 1:
        raise ValueError(f"difficulty must be >= 1, got {difficulty}")
    if difficulty in _LEVELS:
        return _LEVELS[difficulty]
    extra = difficulty - max(_LEVELS)
    return _Level(
        max_num=50 * 2**extra, min_steps=3 + extra // 2, max_steps=4 + extra // 2, ops=("+", "-", "*"), max_factor=5
    )


_NAMES: tuple[tuple[str, str], ...] = (
    ("Tom", "He"), ("Ann", "She"), ("Sam", "He"), ("Mia", "She"), ("Ben", "He"), ("Eva", "She"),
    ("Leo", "He"), ("Zoe", "She"), ("Max", "He"), ("Ivy", "She"), ("Dan", "He"), ("Amy", "She"),
)  # fmt: skip
_ITEMS: tuple[str, ...] = (
    "apples", "pens", "books", "cards", "shells", "stamps", "coins", "marbles", "cookies", "stickers",
    "eggs", "balls",
)  # fmt: skip
_ADD = ("{P} buys {n} more.", "{P} finds {n} more.", "{O} gives {p} {n} more.", "{P} gets {n} more.")
_SUB = ("{P} gives {n} to {O}.", "{P} loses {n}.", "{P} sells {n}.", "{P} gives away {n}.")
_MUL = ("{P} ends up with {n} times as many.", "The number of {item} grows {n} times.")
_THEN = ("", "Then ", "After that ")


def _lower_first(s: str) -> str:
    return s[0].lower() + s[1:]


def _draw_problem(rng: random.Random, lv: _Level) -> tuple[str, str, int, int]:
    """One problem: (question, worked answer ending '#### N', final value, number of steps)."""
    name, pron = rng.choice(_NAMES)
    other = rng.choice([n for n, _ in _NAMES if n != name])
    item = rng.choice(_ITEMS)
    n_steps = rng.randint(lv.min_steps, lv.max_steps)
    cur = rng.randint(1, lv.max_num)
    sentences = [f"{name} has {cur} {item}."]
    lines: list[str] = []
    for i in range(n_steps):
        ops = [o for o in lv.ops if not (o == "-" and cur < 2)]
        op = rng.choice(ops)
        if op == "+":
            n = rng.randint(1, lv.max_num)
            tmpl, new = rng.choice(_ADD), cur + n
        elif op == "-":
            n = rng.randint(1, min(cur - 1, lv.max_num))  # never reach zero or below
            tmpl, new = rng.choice(_SUB), cur - n
        else:
            n = rng.randint(2, lv.max_factor)
            tmpl, new = rng.choice(_MUL), cur * n
        lines.append(f"{cur} {op} {n} = {new}")
        s = tmpl.format(P=pron, p=name, O=other, n=n, item=item)
        then = rng.choice(_THEN) if i > 0 else ""
        if then:
            s = then + (s if s.startswith(name) or s.startswith(other) else _lower_first(s))
        sentences.append(s)
        cur = new
    sentences.append(f"How many {item} does {name} have now?")
    answer = "\n".join(lines) + f"\n#### {cur}"
    return " ".join(sentences), answer, cur, n_steps


def _draw_split(
    rng: random.Random, lv: _Level, n: int, split: str, difficulty: int, taken: set[str]
) -> list[dict]:
    rows: list[dict] = []
    attempts = 0
    while len(rows) < n:
        attempts += 1
        if attempts > 50 * n + 1000:
            raise ValueError(f"could not draw {n} distinct {split} problems at difficulty {difficulty}")
        q, a, final, steps = _draw_problem(rng, lv)
        if q in taken:
            continue
        taken.add(q)
        rows.append(
            {
                "id": f"synth-{split}-{len(rows):06d}",
                "question": q,
                "answer": a,
                "final_answer": str(final),
                "difficulty": difficulty,
                "n_steps": steps,
            }
        )
    return rows


def make_synthetic_dataset(spec: SyntheticSpec) -> dict[str, list[dict]]:
    """{"train": [...], "test": [...]}: deterministic for a spec, disjoint by question text."""
    if spec.n_train < 0 or spec.n_test < 0:
        raise ValueError("n_train and n_test must be >= 0")
    lv = level_for(spec.difficulty)
    taken: set[str] = set()
    # Test first, from its own stream: the held-out split stays the same whatever n_train is.
    test = _draw_split(random.Random(f"synth-test-{spec.seed}-{spec.difficulty}"), lv, spec.n_test, "test",
                       spec.difficulty, taken)  # fmt: skip
    train = _draw_split(random.Random(f"synth-train-{spec.seed}-{spec.difficulty}"), lv, spec.n_train, "train",
                        spec.difficulty, taken)  # fmt: skip
    return {"train": train, "test": test}


# ---- products: problems a tiny model cannot do in its head (the tool demo) ---------------------------------------
@dataclass(frozen=True)
class ProductsSpec:
    """Multi-digit products, "What is 347 * 28?": the worked answer calls the calculator
    (`<calculator>347*28</calculator>`), reads its answer and copies it (docs/environments.md, the tool demo)."""

    n_train: int = 2000
    n_test: int = 200
    seed: int = 0
    digits: tuple[int, int] = (3, 2)


def tool_answer(a: int, b: int) -> str:
    """The worked answer with the calculator, as the tool environment renders it after the sampled call."""
    return f"<calculator>{a}*{b}</calculator>\n= {a * b}\n#### {a * b}"


def make_products_dataset(spec: ProductsSpec) -> dict[str, list[dict]]:
    """{"train": [...], "test": [...]}: deterministic for a spec, disjoint by question text (test drawn first)."""
    lo = [10 ** (d - 1) for d in spec.digits]
    hi = [10 ** d - 1 for d in spec.digits]
    if len(spec.digits) != 2 or min(spec.digits) < 1:
        raise ValueError(f"digits must be two positive counts, got {spec.digits}")
    taken: set[str] = set()

    def split(name: str, n: int) -> list[dict]:
        rng, rows = random.Random(f"products-{name}-{spec.seed}-{spec.digits}"), []
        while len(rows) < n:
            a, b = rng.randint(lo[0], hi[0]), rng.randint(lo[1], hi[1])
            q = f"What is {a} * {b}?"
            if q in taken:
                continue
            taken.add(q)
            rows.append({"id": f"products-{name}-{len(rows):06d}", "question": q, "answer": tool_answer(a, b),
                         "final_answer": str(a * b), "difficulty": sum(spec.digits), "n_steps": 1})
        return rows

    test = split("test", spec.n_test)
    return {"train": split("train", spec.n_train), "test": test}
