"""The evaluator's metrics on a hand-made sample set, against closed forms and scipy (no model needed)."""

from __future__ import annotations

import json
from math import comb

import pytest
from scipy.stats import binomtest

from rlvr_core.eval.evaluate import override_spec
from rlvr_core.eval.metrics import compute_metrics, continued_after_answer, samples_table, vote_key
from rlvr_core.eval.metrics import read_samples
from rlvr_core.experiment.benchmarks import parse_benchmark

SPEC = {
    "name": "handmade", "version": "1",
    "data": {"source": "synthetic", "split": "test", "synthetic": {"n_train": 10, "n_test": 3, "seed": 0, "difficulty": 1}},
    "prompt": {"template": "qa", "model_kind": "base"},
    "generation": {"temperature": 1.0, "n": 4, "greedy": True, "max_new_tokens": 16},
    "verifier": {"name": "gsm8k", "mode": "flexible"},
    "side_by_side": [{"name": "gsm8k", "mode": "strict"}],
    "metrics": ["accuracy", "pass@1", "pass@2", "pass@4", "maj@3", "mean_reward"],
    "breakdown": ["n_steps"],
}
PROBLEMS = [{"id": "p1", "question": "q1", "answer": "5", "meta": {"n_steps": 1}},
            {"id": "p2", "question": "q2", "answer": "4", "meta": {"n_steps": 1}},
            {"id": "p3", "question": "q3", "answer": "9", "meta": {"n_steps": 2}}]
C, I, NA, E = "correct", "incorrect", "no_answer", "error"


def rec(pid, idx, greedy, flex, strict, finish="stop", response="x"):
    (fs, fx), (ss, sx) = flex, strict
    return {"problem_id": pid, "sample_index": idx, "greedy": greedy, "status": fs, "extracted": fx,
            "reward": 1.0 if fs == C else 0.0, "finish_reason": finish, "response": response,
            "continued_after_answer": continued_after_answer(response),
            "side_by_side": {"gsm8k:strict": {"status": ss, "extracted": sx, "reward": 1.0 if ss == C else 0.0}}}


RECORDS = [
    # p1: greedy right both ways; samples 5, 5.0, 7, 7 -> c = 2, maj@3 votes 5 (5 and 5.0 are one answer).
    rec("p1", 0, True, (C, "5"), (C, "5"), response="#### 5\nQuestion: more"),
    rec("p1", 0, False, (C, "5"), (C, "5")), rec("p1", 1, False, (C, "5.0"), (NA, None), finish="length"),
    rec("p1", 2, False, (I, "7"), (NA, None)), rec("p1", 3, False, (I, "7"), (I, "7"), response="#### 7\n#### 7"),
    # p2: greedy wrong; maj@3 is a 3-vs-4 tie (the None does not vote): the first seen, 3, wins -> wrong.
    rec("p2", 0, True, (I, "3"), (NA, None)),
    rec("p2", 0, False, (I, "3"), (NA, None)), rec("p2", 1, False, (C, "4"), (C, "4")),
    rec("p2", 2, False, (NA, None), (NA, None)), rec("p2", 3, False, (C, "4"), (NA, None), finish="length"),
    # p3: greedy right, no sample right (one verifier error) -> c = 0, maj@3 has no votes -> wrong.
    rec("p3", 0, True, (C, "9"), (C, "9"), response="The answer is 9\n\nQuestion: 2+2"),
    rec("p3", 0, False, (NA, None), (NA, None)), rec("p3", 1, False, (NA, None), (NA, None)),
    rec("p3", 2, False, (NA, None), (NA, None)), rec("p3", 3, False, (E, None), (E, None)),
]


def unbiased(n, c, k):
    return 1 - comb(n - c, k) / comb(n, k)


@pytest.fixture(scope="module")
def computed():
    spec = parse_benchmark(SPEC, "<test>", check_data=False)
    rows, curves, summary = compute_metrics(spec, PROBLEMS, RECORDS, {"template": "qa@1", "dtype": "float32"},
                                            eval_id="e", checkpoint="ck")
    return spec, {r["metric"]: r for r in rows}, curves, summary


def test_accuracy_carries_wilson_interval_and_n(computed):
    _, m, _, summary = computed
    ci = binomtest(2, 3).proportion_ci(confidence_level=0.95, method="wilson")
    row = m["accuracy_greedy"]
    assert row["value"] == pytest.approx(2 / 3) and row["n"] == 3
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((ci.low, ci.high), abs=1e-9)
    assert summary["accuracy_greedy"] == pytest.approx(2 / 3) and summary["n"] == 3


def test_pass_at_k_is_the_unbiased_estimator_and_the_curve_goes_to_n(computed):
    _, m, curves, summary = computed
    cs = [2, 2, 0]
    for k in (1, 2, 4):
        want = sum(unbiased(4, c, k) for c in cs) / 3
        assert m[f"pass@{k}"]["value"] == pytest.approx(want) and summary["passk"][str(k)] == pytest.approx(want)
    head = [r for r in curves if r["scoring"] == "gsm8k:flexible"]
    assert [r["k"] for r in head] == [1, 2, 3, 4]
    assert head[2]["value"] == pytest.approx(sum(unbiased(4, c, 3) for c in cs) / 3)
    assert all(r["n_problems"] == 3 and r["source"] == "e/handmade" for r in head)


def test_majority_vote(computed):
    _, m, _, _ = computed
    ci = binomtest(1, 3).proportion_ci(method="wilson")
    assert m["maj@3"]["value"] == pytest.approx(1 / 3)
    assert (m["maj@3"]["ci_low"], m["maj@3"]["ci_high"]) == pytest.approx((ci.low, ci.high), abs=1e-9)
    assert m["mean_reward"]["value"] == pytest.approx(4 / 12) and m["mean_reward"]["n"] == 12


def test_strict_and_flexible_side_by_side(computed):
    _, m, curves, summary = computed
    assert m["accuracy_greedy/gsm8k:strict"]["value"] == pytest.approx(2 / 3)
    assert m["pass@1/gsm8k:strict"]["value"] == pytest.approx((1 + 1 + 0) / 12)
    assert m["pass@1"]["value"] == pytest.approx((2 + 2 + 0) / 12)
    # Strict maj@3: p1 votes (5) -> right; p2 votes (4) -> right; p3 no votes -> wrong.
    assert m["maj@3/gsm8k:strict"]["value"] == pytest.approx(2 / 3)
    assert m["no_answer_share/gsm8k:strict"]["value"] == pytest.approx(9 / 15)
    assert summary["side_by_side"]["gsm8k:strict"]["passk"]["1"] == pytest.approx(2 / 12)
    assert {r["scoring"] for r in curves} == {"gsm8k:flexible", "gsm8k:strict"}


def test_breakdown_by_meta_field(computed):
    _, m, _, _ = computed
    one, two = m["accuracy_greedy/n_steps=1"], m["accuracy_greedy/n_steps=2"]
    assert (one["value"], one["n"], two["value"], two["n"]) == (0.5, 2, 1.0, 1)
    assert one["breakdown_field"] == "n_steps" and one["breakdown_value"] == "1"
    assert m["pass@4/n_steps=1"]["value"] == pytest.approx(1.0) and m["pass@1/n_steps=2"]["value"] == 0.0
    assert m["accuracy_greedy/gsm8k:strict/n_steps=1"]["value"] == 0.5


def test_diagnostic_shares_count_every_completion(computed):
    _, m, _, _ = computed
    assert m["truncation_share"]["value"] == pytest.approx(2 / 15) and m["truncation_share"]["n"] == 15
    assert m["verifier_error_share"]["value"] == pytest.approx(1 / 15)
    assert m["no_answer_share"]["value"] == pytest.approx(4 / 15)
    assert m["verifier_timeout_share"]["value"] == 0.0
    assert m["continuation_after_answer_share"]["value"] == pytest.approx(3 / 15)


def test_every_row_carries_the_settings(computed):
    _, m, _, _ = computed
    for row in m.values():
        assert json.loads(row["settings"]) == {"template": "qa@1", "dtype": "float32"}
        assert (row["eval_id"], row["benchmark"], row["benchmark_version"], row["checkpoint"]) == ("e", "handmade", "1", "ck")


def test_records_survive_the_parquet_round_trip(computed):
    spec = computed[0]
    back = read_samples(samples_table(RECORDS))
    rows, _, _ = compute_metrics(spec, PROBLEMS, back, {}, eval_id="e", checkpoint="ck")
    assert {r["metric"]: r["value"] for r in rows} == {k: v["value"] for k, v in computed[1].items()}


def test_greedy_only_benchmark_scores_the_one_completion():
    d = {**SPEC, "generation": {"temperature": 0.0, "n": 1, "max_new_tokens": 16}, "metrics": ["accuracy", "pass@1"],
         "side_by_side": [], "breakdown": []}
    spec = parse_benchmark(d, "<test>", check_data=False)
    greedy = [r for r in RECORDS if r["greedy"]]
    rows, curves, summary = compute_metrics(spec, PROBLEMS, greedy, {}, eval_id="e", checkpoint="ck")
    m = {r["metric"]: r["value"] for r in rows}
    assert m["accuracy_greedy"] == m["pass@1"] == pytest.approx(2 / 3) and [r["k"] for r in curves] == [1]
    with pytest.raises(ValueError, match="p1.*2 sampled completions, expected 1"):
        compute_metrics(spec, PROBLEMS, greedy + greedy[:1], {}, eval_id="e", checkpoint="ck")


def test_continuation_and_vote_keys():
    assert continued_after_answer("so 5.\n#### 5\nQuestion: next one")
    assert continued_after_answer("#### 5\n\n  more text")
    assert not continued_after_answer("so 5.\n#### 5\n  \n")
    assert not continued_after_answer("5 apples, no marker\nand more")
    assert continued_after_answer("Final Answer: The final answer is $3$. I hope it is correct.\nProblem: x")
    assert vote_key("1,080", "gsm8k") == vote_key("1080.0", "gsm8k") == "1080"
    assert vote_key("\\frac{1}{2}", "math") != vote_key("0.5", "math")
    assert vote_key("  ", "gsm8k") is None and vote_key(None, "mcq") is None


def test_overrides_are_validated_and_drop_k_beyond_n():
    spec = parse_benchmark(SPEC, "<test>", check_data=False)
    small = override_spec(spec, n=2, max_problems=2)
    assert small.generation.n == 2 and small.data.max_problems == 2
    assert small.metrics == ["accuracy", "pass@1", "pass@2", "mean_reward"]
    greedy = override_spec(spec, temperature=0.0)
    assert greedy.generation.n == 1 and not greedy.generation.greedy and "pass@1" in greedy.metrics
    assert override_spec(spec) is spec
