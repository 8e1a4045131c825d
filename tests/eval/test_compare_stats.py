"""Comparison statistics on hand-made evaluations, against scipy and hand counts (no model needed)."""

from __future__ import annotations

import random

import pytest
from scipy import stats

from rlvr_core.eval.compare import (HIST_BINS, EvalSource, SettingsMismatch, compare, mcnemar_exact_p,
                                    paired_t_interval, pass_rate_histogram, t_quantile, to_markdown)

SETTINGS = {"benchmark": "toy", "template": "qa@1", "temperature": 1.0, "n": 2, "max_new_tokens": 48,
            "dtype": "float32", "parallelism": "single-process", "verifier": "gsm8k", "verifier_mode": "flexible",
            "verifier_versions": {"gsm8k:flexible": "1"}, "side_by_side": [], "batch_size": 64}


def records(greedy: dict[str, bool], sampled: dict[str, list[bool]]) -> list[dict]:
    out = []
    for pid, ok in greedy.items():
        out.append({"benchmark": "toy", "problem_id": pid, "sample_index": 0, "greedy": True,
                    "status": "correct" if ok else "incorrect", "side_by_side": {}})
    for pid, oks in sampled.items():
        out += [{"benchmark": "toy", "problem_id": pid, "sample_index": i, "greedy": False,
                 "status": "correct" if ok else "incorrect", "side_by_side": {}} for i, ok in enumerate(oks)]
    return out


A = records({"p1": True, "p2": True, "p3": False, "p4": False},
            {"p1": [True, True], "p2": [True, False], "p3": [False, False], "p4": [False, False]})
B = records({"p1": False, "p2": True, "p3": True, "p4": False},
            {"p1": [False, False], "p2": [True, True], "p3": [False, True], "p4": [False, False]})


def test_t_quantile_matches_the_printed_table():
    # Student's t table (two-sided 95 % and 99 %; e.g. NIST/SEMATECH e-Handbook, table 1.3.6.7.2).
    table = {(0.975, 1): 12.706, (0.975, 2): 4.303, (0.975, 9): 2.262, (0.975, 30): 2.042, (0.995, 5): 4.032,
             (0.995, 20): 2.845, (0.9, 10): 1.372}
    for (p, df), value in table.items():
        assert t_quantile(p, df) == pytest.approx(value, abs=5e-4)
        assert t_quantile(1 - p, df) == pytest.approx(-value, abs=5e-4)
    with pytest.raises(ValueError):
        t_quantile(1.0, 3)


def test_paired_interval_matches_scipy_ttest_rel():
    rng = random.Random(3)
    a = [rng.random() for _ in range(40)]
    b = [x + rng.gauss(0.05, 0.2) for x in a]
    mean, lo, hi = paired_t_interval([y - x for x, y in zip(a, b)])
    ci = stats.ttest_rel(b, a).confidence_interval(0.95)
    assert (lo, hi) == pytest.approx((ci.low, ci.high), rel=1e-9)
    assert mean == pytest.approx(sum(b) / 40 - sum(a) / 40)
    assert paired_t_interval([0.5]) == (0.5, None, None) and paired_t_interval([0.0, 0.0]) == (0.0, 0.0, 0.0)


def test_mcnemar_matches_the_binomial_test():
    for a_only, b_only in ((0, 0), (3, 9), (10, 2), (7, 7), (0, 12)):
        want = 1.0 if a_only + b_only == 0 else stats.binomtest(min(a_only, b_only), a_only + b_only, 0.5).pvalue
        assert mcnemar_exact_p(a_only, b_only) == pytest.approx(want, rel=1e-12)


def test_histogram_bins():
    h = pass_rate_histogram([0.0, 0.05, 0.1, 0.3, 0.30000000000000004, 0.5, 0.95, 0.9999, 1.0])
    assert list(h) == HIST_BINS
    assert h == {**dict.fromkeys(HIST_BINS, 0), "0": 1, "(0,0.1]": 2, "(0.2,0.3]": 2, "(0.4,0.5]": 1,
                 "(0.9,1)": 2, "1": 1}


def test_compare_pairs_problems_and_lists_what_each_solves():
    res = compare(EvalSource("A", "a", A, {"toy": SETTINGS}), EvalSource("B", "b", B, {"toy": SETTINGS}))
    r = res["benchmarks"]["toy"]
    acc = r["deltas"]["accuracy_greedy"]
    ci = stats.ttest_rel([0, 1, 1, 0], [1, 1, 0, 0]).confidence_interval(0.95)
    assert (acc["a"], acc["b"], acc["delta"]) == (0.5, 0.5, 0.0)
    assert (acc["ci_low"], acc["ci_high"]) == pytest.approx((ci.low, ci.high))
    assert (acc["a_only"], acc["b_only"], acc["mcnemar_p"]) == (1, 1, 1.0)
    p1 = r["deltas"]["pass@1"]
    assert (p1["a"], p1["b"]) == (pytest.approx(1.5 / 4), pytest.approx(1.5 / 4))
    ci = stats.ttest_rel([0, 1, 0.5, 0], [1, 0.5, 0, 0]).confidence_interval(0.95)
    assert (p1["ci_low"], p1["ci_high"]) == pytest.approx((ci.low, ci.high))
    assert set(r["deltas"]) == {"accuracy_greedy", "pass@1", "pass@2"}
    assert r["solved_greedy"] == {"a_only": ["p1"], "b_only": ["p3"]}
    assert r["solved_ever"] == {"a_only": ["p1"], "b_only": ["p3"]}
    assert r["solvable_overlap"] == {"both": 1, "a_only": 1, "b_only": 1, "neither": 1}
    # pass@2 with n = 2: solved at least once. A: p1, p2; B: p2, p3.
    assert r["passk_curves"] == {"a": {"1": 0.375, "2": 0.5}, "b": {"1": 0.375, "2": 0.5}}
    assert r["pass_rate_histogram"]["a"]["1"] == 1 and r["pass_rate_histogram"]["a"]["0"] == 2
    assert r["pass_rate_histogram"]["b"]["(0.4,0.5]"] == 1
    md = to_markdown(res)
    assert "`p1`" in md and "`p3`" in md and "WARNING" not in md and "| 2 | 50.0 | 50.0 |" in md


def test_compare_refuses_different_settings_unless_allowed():
    other = {**SETTINGS, "max_new_tokens": 64, "verifier_versions": {"gsm8k:flexible": "2"}, "batch_size": 8}
    a, b = EvalSource("A", "a", A, {"toy": SETTINGS}), EvalSource("B", "b", B, {"toy": other})
    with pytest.raises(SettingsMismatch) as e:
        compare(a, b)
    msg = str(e.value)
    assert "toy: max_new_tokens: A=48 B=64" in msg and "verifier_versions.gsm8k:flexible: A='1' B='2'" in msg
    assert "batch_size" not in msg  # per-request seeds: batching does not change completions
    with pytest.warns(UserWarning, match="COMPARING ANYWAY"):
        res = compare(a, b, allow_different_settings=True)
    assert [d["setting"] for d in res["settings_differ"]["toy"]] == ["max_new_tokens", "verifier_versions.gsm8k:flexible"]
    assert "WARNING: the settings differ" in to_markdown(res)
    # Only batching differs: comparable.
    compare(a, EvalSource("B", "b", B, {"toy": {**SETTINGS, "batch_size": 8}}))


def test_compare_needs_a_common_benchmark():
    with pytest.raises(ValueError, match="no benchmark in common"):
        compare(EvalSource("A", "a", A, {"toy": SETTINGS}), EvalSource("B", "b", B, {"other": SETTINGS}))


def test_g_regression_flags_a_trained_model_worse_than_its_base_beyond_the_paired_interval():
    """G-regression, on `compare`'s own paired interval (scipy's ttest_rel gives the same): 40 problems, the
    trained side loses 12 the base solved and wins 2 → Δ −25 points, interval entirely below 0: flagged. Losing 3
    and winning 2 is inside the noise: not flagged, and neither is a gain."""
    from rlvr_core.eval.metrics import regression_flag

    def pair(lost: int, won: int):
        base = {f"p{i}": i < 20 for i in range(40)}
        trained = {p: (ok and int(p[1:]) >= lost) or (not ok and int(p[1:]) < 20 + won) for p, ok in base.items()}
        res = compare(EvalSource("base", "base", records(base, {}), {"toy": SETTINGS}),
                      EvalSource("trained", "trained", records(trained, {}), {"toy": SETTINGS}))
        return res["benchmarks"]["toy"]["deltas"]["accuracy_greedy"], base, trained

    d, base, trained = pair(12, 2)
    ci = stats.ttest_rel([float(trained[p]) for p in base], [float(base[p]) for p in base]).confidence_interval(0.95)
    assert d["delta"] == pytest.approx(-0.25) and d["ci_high"] == pytest.approx(ci.high) and ci.high < 0
    flag = regression_flag(d, "toy")
    assert flag["guard_id"] == "G-regression" and flag["value"] == pytest.approx(-0.25) and flag["n"] == 40
    assert "worse than its base by 25.0 points" in flag["reason"] and "n=40" in flag["reason"]
    assert regression_flag(pair(3, 2)[0], "toy") is None  # -2.5 points, interval spans 0
    assert regression_flag(pair(2, 12)[0], "toy") is None  # a gain
    assert regression_flag(None, "toy") is None
