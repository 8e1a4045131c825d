"""Pass-rate tables, filtering, orderings and id reconciliation, checked against values built by hand."""

from fractions import Fraction
from math import comb

import numpy as np
import pyarrow as pa
import pytest

from rlvr_core.data.curriculum import (IdMismatchError, filter_by_pass_rate, known_orderings, order_curriculum,
                                       pass_rate_table, reconcile_ids)

# problem -> (n, c, n_truncated); statuses: correct for the c correct ones, the rest alternate wrong/no_answer
SPEC = {"b": (8, 0, 2), "a": (8, 3, 0), "c": (8, 8, 1), "d": (4, 1, 4), "e": (8, 5, 0)}


def records(spec=SPEC):
    out = []
    for pid, (n, c, trunc) in spec.items():
        for i in range(n):
            out.append({"problem_id": pid, "sample_index": i, "correct": i < c,
                        "status": "correct" if i < c else ("wrong" if i % 2 else "no_answer"),
                        "length": 10 * (i + 1), "finish_reason": "length" if i < trunc else "stop"})
    return out[::-1]  # input order must not matter


def test_pass_rate_table_against_hand_values():
    t = pass_rate_table(records())
    d = t.to_pydict()
    assert d["problem_id"] == ["a", "b", "c", "d", "e"]
    assert t.column_names[:8] == ["problem_id", "n", "c", "pass_rate", "pass@1", "pass@2", "pass@4", "pass@8"]
    for row, pid in enumerate(d["problem_id"]):
        n, c, trunc = SPEC[pid]
        assert (d["n"][row], d["c"][row]) == (n, c)
        assert d["pass_rate"][row] == pytest.approx(c / n, abs=1e-15)
        for k in (1, 2, 4, 8):
            exact = None if k > n else float(1 - Fraction(comb(n - c, k), comb(n, k)))
            assert (d[f"pass@{k}"][row] is None) if exact is None else d[f"pass@{k}"][row] == pytest.approx(exact, abs=1e-12)
        assert d["mean_length"][row] == pytest.approx(np.mean([10 * (i + 1) for i in range(n)]))
        assert d["truncation_share"][row] == pytest.approx(trunc / n)
        assert d["status_correct"][row] == c
        assert d["status_correct"][row] + d["status_wrong"][row] + d["status_no_answer"][row] == n
    assert pass_rate_table(pa.Table.from_pylist(records())).equals(t)  # a table of records works too


def test_pass_rate_table_ks_and_errors():
    t = pass_rate_table(records({"x": (3, 1, 0)}), ks=(1, 2, 4, 8))
    assert [c for c in t.column_names if c.startswith("pass@")] == ["pass@1", "pass@2"]
    with pytest.raises(ValueError, match="appears twice"):
        pass_rate_table(records() + records({"a": (1, 1, 0)}))
    with pytest.raises(KeyError, match="finish_reason"):
        pass_rate_table([{"problem_id": "a", "correct": True, "status": "correct", "length": 1}])
    with pytest.raises(ValueError):
        pass_rate_table([])


def test_filter_by_pass_rate():
    t = pass_rate_table(records())
    ids = lambda tab: tab.column("problem_id").to_pylist()
    assert ids(filter_by_pass_rate(t)) == ["a", "d", "e"]  # drops never (b) and always (c) solved
    assert ids(filter_by_pass_rate(t, drop_never=False, drop_always=False)) == ["a", "b", "c", "d", "e"]
    assert ids(filter_by_pass_rate(t, low=0.3, high=0.5)) == ["a"]  # 3/8 in, 1/4 and 5/8 out
    assert ids(filter_by_pass_rate(t, low=0.25, high=0.25)) == ["d"]  # bounds inclusive
    with pytest.raises(ValueError):
        filter_by_pass_rate(t, low=0.6, high=0.5)


def rates(tab):
    return tab.column("pass_rate").to_pylist()


def test_orderings():
    t = pass_rate_table(records())
    assert {"easy_to_hard", "hard_to_easy", "random", "bucketed", "interleaved"} <= set(known_orderings())
    e2h = order_curriculum(t, "easy_to_hard")
    assert rates(e2h) == sorted(rates(t), reverse=True) and e2h.column("order").to_pylist() == [0, 1, 2, 3, 4]
    assert rates(order_curriculum(t, "hard_to_easy")) == sorted(rates(t))
    r1, r2 = order_curriculum(t, "random", seed=1), order_curriculum(t, "random", seed=1)
    assert r1.equals(r2)
    shuffled_input = t.take(pa.array([4, 2, 0, 3, 1]))
    assert order_curriculum(shuffled_input, "random", seed=1).column("problem_id").equals(r1.column("problem_id"))
    seqs = {tuple(order_curriculum(t, "random", seed=s).column("problem_id").to_pylist()) for s in range(20)}
    assert len(seqs) > 5  # the seed matters
    with pytest.raises(KeyError, match="known"):
        order_curriculum(t, "nope")


def test_bucketed_and_interleaved():
    spec = {f"p{i:02d}": (10, i % 11, 0) for i in range(12)}  # pass rates 0.0 .. 1.0
    t = pass_rate_table(records(spec))
    b = rates(order_curriculum(t, "bucketed", n_buckets=3, seed=0))
    # buckets of 4, easiest first: every rate in a bucket >= every rate in the next bucket
    assert min(b[0:4]) >= max(b[4:8]) and min(b[4:8]) >= max(b[8:12])
    hard_first = rates(order_curriculum(t, "bucketed", n_buckets=3, seed=0, easy_first=False))
    assert max(hard_first[0:4]) <= min(hard_first[4:8])
    inter = order_curriculum(t, "interleaved", n_buckets=3, seed=0)
    buckets = [set(order_curriculum(t, "bucketed", n_buckets=3, seed=0).column("problem_id").to_pylist()[j:j + 4])
               for j in (0, 4, 8)]
    ids = inter.column("problem_id").to_pylist()
    for j, pid in enumerate(ids):
        assert pid in buckets[j % 3]  # round-robin over the buckets
    assert sorted(ids) == sorted(t.column("problem_id").to_pylist())


def test_reconcile_ids_fails_loudly():
    data = [f"gsm8k/train/{i}" for i in range(100)]
    cur = [f"gsm8k/train/{i}" for i in range(90)] + ["GSM8K/train/5000", "gsm8k/train/x 1", "other/1"]
    with pytest.raises(IdMismatchError) as e:
        reconcile_ids(cur, data)
    msg = str(e.value)
    assert "3 of 93 curriculum ids are not in the data set (100 ids" in msg
    assert "GSM8K/train/5000" in msg and "other/1" in msg
    assert reconcile_ids(cur[:90], data) == cur[:90]
    with pytest.warns(UserWarning, match="dropping 3"):
        assert reconcile_ids(cur, data, tolerance=3) == cur[:90]
    with pytest.raises(IdMismatchError):
        reconcile_ids(cur, data, tolerance=2)
    with pytest.warns(UserWarning):
        reconcile_ids(cur, data, tolerance=0.05)  # 5% of 93 -> 4 allowed
    with pytest.raises(IdMismatchError, match="more than once"):
        reconcile_ids(["a", "a"], ["a"])


def test_reconcile_hints_at_normalisation():
    with pytest.raises(IdMismatchError, match=r"2 of 3 .*; 1 of them match after normalize_id"):
        reconcile_ids(["MATH/Test/Algebra 1", "math/test/algebra-2", "math/test/x"],
                      ["math/test/algebra-1", "math/test/algebra-2"])
