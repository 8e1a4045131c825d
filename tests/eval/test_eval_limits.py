"""Eval thresholds (G-verifier-error, G-truncation) on real evaluations of the tiny checkpoints: a planted
crashing checker and a generation cap that cuts most answers off are flagged, with the numbers unchanged, in
the result, `rlvr eval`'s output, the pipeline's health events, the warehouse and the run report; a clean
evaluation is not flagged."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import typer
from typer.testing import CliRunner

from rlvr_core.artifacts.storage import LocalStore
from rlvr_core.eval.evaluate import RunSettings, evaluate
from rlvr_core.eval.metrics import EVAL_FILE, METRICS_FILE
from rlvr_core.experiment.benchmarks import load_benchmark, parse_benchmark
from rlvr_core.experiment.config import EvalConfig, parse_config
from rlvr_core.pipeline import stages
from rlvr_core.records import report, warehouse
from rlvr_core.records.runrecord import upload_run_folder, write_run_folder
from rlvr_core.verifiers.base import _REGISTRY, register_verifier

FAST = RunSettings(verifier_workers=0)
CRASH = "_test_crash"


class _Crash:
    """The reported IFBench case: the checker raises TypeError on arguments it did not expect."""

    name, version = CRASH, "1"
    can_hang = False  # it raises at once

    def warm_up(self) -> None:
        pass

    def verify(self, response: str, gold):
        raise TypeError("check_following() got an unexpected keyword argument 'N'")


if CRASH not in _REGISTRY:
    register_verifier(CRASH)(_Crash)


def _crashing_spec():
    d = load_benchmark("synthetic").model_dump(mode="json")
    d["verifier"], d["side_by_side"] = {"name": CRASH}, []
    return parse_benchmark(d, "synthetic with a crashing checker", check_data=False)


def test_defaults_would_have_caught_the_reported_cases():
    d = EvalConfig()
    assert d.max_verifier_error_share < 1.0  # a crashing checker: every completion an error
    assert d.max_truncation_share < 0.13     # 13 % of the answers cut off


def test_crashing_checker_flags_the_evaluation_and_keeps_its_numbers(tiny_checkpoints, tmp_path):
    res = evaluate(tiny_checkpoints[1], [_crashing_spec()], out=tmp_path, run=FAST, max_problems=4, n=2,
                   max_new_tokens=8)
    s = res.benchmarks[0].summary
    assert s["verifier_error_share"] == 1.0 and s["accuracy_greedy"] == 0.0  # measured as it is
    (flag,) = [f for f in s["flags"] if f["guard_id"] == "G-verifier-error"]
    assert (flag["metric"], flag["value"], flag["n"], flag["limit"]) == ("verifier_error_share", 1.0, 4 * 3, 0.05)
    assert "100.0% of 12 completions" in flag["reason"]
    # The files carry the flag (eval.json); the metric rows keep the plain share.
    assert json.loads((tmp_path / EVAL_FILE).read_text())["benchmarks"]["synthetic"]["summary"]["flags"] == s["flags"]
    rows = {r["metric"]: r["value"] for r in pq.read_table(tmp_path / METRICS_FILE).to_pylist()}
    assert rows["verifier_error_share"] == 1.0


def test_short_cap_flags_truncation_and_a_clean_eval_is_not_flagged(tiny_checkpoints):
    short, clean = (evaluate(tiny_checkpoints[1], [load_benchmark("synthetic")], run=FAST, max_problems=4, n=2,
                             max_new_tokens=m).benchmarks[0].summary for m in (2, 48))
    assert short["truncation_share"] > 0.5
    assert [f["guard_id"] for f in short["flags"]] == ["G-truncation"]
    assert clean["truncation_share"] <= 0.1 and clean["verifier_error_share"] == 0
    assert clean["flags"] == []


def test_rlvr_eval_warns_and_records_the_flag(tiny_checkpoints, rlvr_home):
    from rlvr_cli.eval import eval_command

    app = typer.Typer()
    app.command()(eval_command)
    out = rlvr_home / "ev"
    r = CliRunner().invoke(app, [str(tiny_checkpoints[1]), "--benchmark", "synthetic", "--max-problems", "4",
                                 "--n", "1", "--max-new-tokens", "2", "--verifier-workers", "0", "--quiet",
                                 "--record", "--eval-id", "short", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "WARNING G-truncation: synthetic: truncated completions 100.0% of 8 completions" in r.output
    assert "(truncation_share; limit 10%)" in r.output
    got = warehouse.query("select guard_id, step, source, key from health_events", path=rlvr_home / "warehouse.duckdb")[1]
    assert got == [("G-truncation", 0, "eval", "short/truncation_share")]


def test_pipeline_eval_flag_reaches_health_events_warehouse_and_report(tiny_checkpoints, rlvr_home, tmp_path):
    from rlvr_core.pipeline import run_record

    cfg = parse_config({"eval": {"max_problems": 4, "n_samples": 1, "max_new_tokens": 2}})
    data = stages.prepare_data(cfg)
    model = stages.ModelArtifact(str(tiny_checkpoints[1]), "strong", "h", "t", True)
    art = stages.evaluate_stage(cfg, data, model, eval_id="base", checkpoint="base")
    assert [f["guard_id"] for f in art.summary["flags"]] == ["G-truncation"]
    ev = run_record.StageOutputs(data, model, None, None, art, None, None, None)
    events = run_record.eval_events(ev)
    assert [(e["guard_id"], e["step"], e["source"]) for e in events] == [("G-truncation", 0, "eval")]
    run_id = "evalflag1"
    local = write_run_folder(tmp_path / run_id, run={"run_id": run_id, "experiment": "exp", "kind": "pipeline",
                                                     "status": "FINISHED"}, params={}, manifest={}, config_yaml="",
                             summary={}, tables={"train/health_events.parquet": warehouse.health_events_table(events),
                                                 "evals/metrics.parquet": art.metrics})
    store = LocalStore(tmp_path / "store")
    upload_run_folder(store, f"exp/{run_id}", local)
    db = tmp_path / "w.duckdb"
    warehouse.ingest_run(store, f"exp/{run_id}", db)
    assert warehouse.query("select guard_id, step, serious, source from health_events", path=db)[1] == [
        ("G-truncation", 0, False, "eval")]
    report.build_report(run_id, store=store, warehouse_path=db)
    html = store.get_text(f"exp/{run_id}/reports/index.html")
    assert "G-truncation" in html.split("<h3>Guard firings</h3>")[1].split("<h2>")[0]
    # The pipeline's markdown report names the flag too.
    s = {"mlflow_run_id": run_id, "accuracy_greedy": 0.0, "accuracy_greedy_ci95": [0.0, 0.5], "n_eval": 4,
         "passk": {}, "mlflow_run_url": "u", "artifact_uri": "a", "config_hash": "c",
         "eval_flags": [{"eval_id": "base", **f} for f in art.summary["flags"]]}
    assert "**flag** base evaluation: G-truncation: synthetic" in run_record.report_markdown(cfg, s)

