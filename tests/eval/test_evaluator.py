"""The evaluator on real (tiny) checkpoints: files, metrics recomputed from the rows, one code path with the demo."""

from __future__ import annotations

import json
import re
from math import comb

import pyarrow.parquet as pq
import pytest
from scipy.stats import binomtest

from rlvr_core.data.templates import get_template
from rlvr_core.eval.evaluate import RunSettings, evaluate
from rlvr_core.eval.metrics import CURVES_FILE, EVAL_FILE, METRICS_FILE, SAMPLES_FILE
from rlvr_core.experiment.benchmarks import benchmark_hash, load_benchmark
from rlvr_core.experiment.config import parse_config
from rlvr_core.pipeline import stages
from rlvr_core.pipeline.evaluation_stage import held_out_eval
from rlvr_core.records import warehouse
from rlvr_core.sampling.models import load_model
from rlvr_core.verifiers import get_verifier

FAST = RunSettings(verifier_workers=0)


def _warehouse_columns(table: str) -> list[str]:
    sql = warehouse.MIGRATIONS[0][2]
    body = re.search(rf"CREATE TABLE {table} \((.*?)\n    \);", sql, re.S).group(1)
    return [line.split()[0] for line in body.strip().splitlines() if line.strip() and not line.strip().startswith("--")]


@pytest.fixture(scope="module")
def synthetic_eval(tiny_checkpoints, tmp_path_factory):
    out = tmp_path_factory.mktemp("eval")
    res = evaluate(tiny_checkpoints[0], [load_benchmark("synthetic")], out=out, max_problems=10, n=4, eval_id="weak")
    return res, out


def test_files_have_the_warehouse_columns(synthetic_eval):
    _, out = synthetic_eval
    samples, metrics, curves = (pq.read_table(out / f) for f in (SAMPLES_FILE, METRICS_FILE, CURVES_FILE))
    for table, cols in (("eval_samples", samples.column_names), ("eval_metrics", metrics.column_names),
                        ("passk_curves", curves.column_names)):
        missing = [c for c in _warehouse_columns(table) if c != "run_id" and c not in cols]
        assert not missing, (table, missing)
    assert samples.num_rows == 10 * (1 + 4)
    record = json.loads((out / EVAL_FILE).read_text())
    assert record["eval_id"] == "weak" and set(record["benchmarks"]) == {"synthetic"}


def test_metrics_recompute_from_the_sample_rows(synthetic_eval):
    res, out = synthetic_eval
    rows = pq.read_table(out / SAMPLES_FILE).to_pylist()
    metrics = {r["metric"]: r for r in pq.read_table(out / METRICS_FILE).to_pylist()}
    greedy = [r for r in rows if r["greedy"]]
    k = sum(r["status"] == "correct" for r in greedy)
    ci = binomtest(k, 10).proportion_ci(method="wilson")
    acc = metrics["accuracy_greedy"]
    assert (acc["value"], acc["n"]) == (k / 10, 10)
    assert (acc["ci_low"], acc["ci_high"]) == pytest.approx((ci.low, ci.high), abs=1e-9)
    c = {}
    for r in rows:
        if not r["greedy"]:
            c[r["problem_id"]] = c.get(r["problem_id"], 0) + (r["status"] == "correct")
    for kk in (1, 2, 4):
        want = sum(1 - comb(4 - x, kk) / comb(4, kk) for x in c.values()) / 10
        assert metrics[f"pass@{kk}"]["value"] == pytest.approx(want)
    assert "pass@8" not in metrics  # the n override dropped k > n
    trunc = sum(r["finish_reason"] == "length" for r in rows) / len(rows)
    assert metrics["truncation_share"]["value"] == pytest.approx(trunc)
    strict = sum(json.loads(r["side_by_side"])["gsm8k:strict"]["status"] == "correct" for r in greedy) / 10
    assert metrics["accuracy_greedy/gsm8k:strict"]["value"] == pytest.approx(strict)
    curves = pq.read_table(out / CURVES_FILE).to_pylist()
    assert sorted(r["k"] for r in curves if r["scoring"] == "gsm8k:flexible") == [1, 2, 3, 4]


def test_settings_travel_with_every_metric(synthetic_eval):
    res, out = synthetic_eval
    spec = res.benchmarks[0].spec
    for row in pq.read_table(out / METRICS_FILE).to_pylist():
        s = json.loads(row["settings"])
        assert s["benchmark_hash"] == benchmark_hash(spec) and s["template"] == "qa@1"
        assert (s["temperature"], s["n"], s["max_new_tokens"], s["dtype"], s["parallelism"]) == (
            1.0, 4, 48, "float32", "single-process")
        v = get_verifier("gsm8k").version  # each mode's outcomes carry the verifier's version
        assert v and s["verifier_versions"] == {"gsm8k:flexible": v, "gsm8k:strict": v}
        assert s["stop"] == list(get_template("qa").stop)
    # The stop sequence cut every completion before a new question (G-stop-seq).
    assert not any("\nQuestion:" in r["response"] for r in pq.read_table(out / SAMPLES_FILE).to_pylist())


def test_demo_stage_and_evaluator_are_one_code_path(tiny_checkpoints, synthetic_eval, rlvr_home):
    """evaluate_stage (what `rlvr demo` runs) == evaluate() (what `rlvr eval` runs) on the same checkpoint."""
    res, _ = synthetic_eval
    cfg = parse_config({"eval": {"max_problems": 10, "n_samples": 4}, "grpo": {"eval_samples": 4}})
    assert stages.held_out_spec(parse_config({})) == load_benchmark("synthetic")  # the demo's default is the file
    assert benchmark_hash(stages.held_out_spec(cfg)) == benchmark_hash(res.benchmarks[0].spec)
    data = stages.prepare_data(cfg)
    model = stages.ModelArtifact(str(tiny_checkpoints[0]), "weak", "h", "t", True)
    art = stages.evaluate_stage(cfg, data, model, eval_id="weak", checkpoint="weak")
    b = res.benchmarks[0]
    assert art.summary["accuracy_greedy"] == b.summary["accuracy_greedy"]
    assert art.summary["accuracy_greedy_ci"] == b.summary["accuracy_greedy_ci"]
    assert art.summary["passk"] == b.summary["passk"] and art.curve == b.curve
    key = ["problem_id", "sample_index", "greedy", "response", "status"]
    assert art.samples.select(key).to_pylist() == res.samples_table().select(key).to_pylist()
    # The trainer's periodic evaluation goes through the same evaluator: same greedy accuracy and pass@k.
    m, tok = load_model(model.path)
    periodic = held_out_eval(cfg, data)(m, tok)
    assert periodic["greedy_pass_at_1"] == b.summary["accuracy_greedy"] and periodic["greedy_pass_at_1_n"] == 10
    assert {k: periodic[f"pass_at_{k}"] for k in (1, 2, 4)} == b.curve


@pytest.mark.shared_data
def test_gsm8k_few_shot_on_the_real_test_set(tiny_checkpoints):
    res = evaluate(tiny_checkpoints[0], [load_benchmark("gsm8k")], run=FAST, max_problems=3, max_new_tokens=12)
    b = res.benchmarks[0]
    assert b.settings["template"] == "gsm8k/qa/5shot@1.1" and b.settings["data_hash"]
    assert [r["problem_id"] for r in b.samples] == ["gsm8k/test/0", "gsm8k/test/1", "gsm8k/test/2"]
    assert all(set(r["side_by_side"]) == {"gsm8k:flexible"} for r in b.samples)
    # 12 tokens are too few for a worked answer: truncation is counted, not hidden (G-truncation).
    trunc = sum(r["finish_reason"] == "length" for r in b.samples) / 3
    assert b.summary["truncation_share"] == pytest.approx(trunc)


def test_benchmarks_for_another_model_kind_are_skipped(tiny_checkpoints):
    # The chat benchmark is skipped before its data is read, so its data files need not exist here.
    res = evaluate(tiny_checkpoints[0], [load_benchmark("ifeval", check_data=False), load_benchmark("synthetic")],
                   run=FAST, model_kind="base", max_problems=2, n=1, max_new_tokens=8)
    assert [b.spec.name for b in res.benchmarks] == ["synthetic"]
    assert res.skipped[0]["benchmark"] == "ifeval" and "chat" in res.skipped[0]["why"]
    with pytest.raises(FileNotFoundError, match="no config.json"):
        evaluate(tiny_checkpoints[0].parent, [load_benchmark("synthetic")])
