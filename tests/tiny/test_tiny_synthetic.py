"""Synthetic GSM8K-form data: determinism, disjointness, and arithmetic checked by an independent eval."""

from __future__ import annotations

import json
import re

import pytest

from rlvr_core.data.jsonl import read_jsonl, write_jsonl
from rlvr_core.data.synthetic import SyntheticSpec, make_synthetic_dataset

LINE = re.compile(r"^(-?\d+) ([-+*]) (\d+) = (-?\d+)$")


def test_deterministic_for_a_spec():
    spec = SyntheticSpec(n_train=200, n_test=50, seed=3, difficulty=2)
    assert make_synthetic_dataset(spec) == make_synthetic_dataset(spec)
    other = make_synthetic_dataset(SyntheticSpec(n_train=200, n_test=50, seed=4, difficulty=2))
    assert other["test"] != make_synthetic_dataset(spec)["test"]


def test_test_split_does_not_depend_on_n_train():
    a = make_synthetic_dataset(SyntheticSpec(n_train=10, n_test=30))
    b = make_synthetic_dataset(SyntheticSpec(n_train=300, n_test=30))
    assert a["test"] == b["test"]


@pytest.mark.parametrize("difficulty", [1, 2, 3, 4, 6])
def test_disjoint_unique_and_well_formed(difficulty):
    ds = make_synthetic_dataset(SyntheticSpec(n_train=300, n_test=100, seed=1, difficulty=difficulty))
    train, test = ds["train"], ds["test"]
    assert len(train) == 300 and len(test) == 100
    tq, sq = {r["question"] for r in train}, {r["question"] for r in test}
    assert len(tq) == 300 and len(sq) == 100 and not (tq & sq)
    assert len({r["id"] for r in train + test}) == 400
    assert train[0]["id"] == "synth-train-000000" and test[5]["id"] == "synth-test-000005"
    for r in train + test:
        assert set(r) == {"id", "question", "answer", "final_answer", "difficulty", "n_steps"}
        assert r["difficulty"] == difficulty
        assert r["answer"].endswith(f"\n#### {r['final_answer']}")
        *lines, last = r["answer"].split("\n")
        assert last == f"#### {r['final_answer']}"
        assert len(lines) == r["n_steps"] >= 2
        prev = None
        for line in lines:
            m = LINE.match(line)
            assert m, line
            lhs, rhs = line.split(" = ")
            assert eval(lhs, {"__builtins__": {}}) == int(rhs), line  # independent reference
            if prev is not None:
                assert int(m.group(1)) == prev, r["answer"]  # each step starts from the last result
            prev = int(rhs)
        assert prev == int(r["final_answer"]) > 0
        first = LINE.match(lines[0]).group(1)
        assert f" has {first} " in r["question"]
        assert r["question"].endswith("have now?")


def test_difficulty_turns_up_numbers_and_steps():
    def stats(d):
        rows = make_synthetic_dataset(SyntheticSpec(n_train=300, n_test=0, difficulty=d))["train"]
        return max(int(r["final_answer"]) for r in rows), sum(r["n_steps"] for r in rows) / len(rows)

    (m1, s1), (m3, s3), (m5, s5) = stats(1), stats(3), stats(5)
    assert m1 < m3 < m5 and s1 < s3 < s5


def test_jsonl_round_trip_and_bad_line(tmp_path):
    rows = make_synthetic_dataset(SyntheticSpec(n_train=5, n_test=2))["train"]
    p = write_jsonl(rows, tmp_path / "sub" / "train.jsonl")
    assert read_jsonl(p) == rows
    with p.open("a") as f:
        f.write('{"id": "broken"\n')
    with pytest.raises(ValueError, match=r"train\.jsonl:6"):
        read_jsonl(p)
    assert json.loads(p.read_text().splitlines()[0])["id"] == "synth-train-000000"
