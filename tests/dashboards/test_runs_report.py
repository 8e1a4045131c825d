"""The cross-run training analysis (`rlvr probe runs`, rlvr_core/probe/runs_report.py) on the sample warehouse:
every number is checked against the raw values the sample runs were built from."""

from __future__ import annotations


import pytest
import sample_runs
from typer.testing import CliRunner

from rlvr_cli.probe import probe_app
from rlvr_core.probe.runs_report import training_run_report


def test_report_of_an_experiment(sample_warehouse, tmp_path):
    runs = sample_warehouse.runs
    r = training_run_report(tmp_path, experiment=sample_runs.EXPERIMENT, steps=[1, 22, 30], db=sample_warehouse.db)
    ids = sorted(runs.run_ids)
    assert [x["run_id"] for x in r["runs"]] == ids
    # What the runs varied: lr, the seeds, the names and the per-trial keys; beta is the same everywhere.
    varied = set(r["varied_params"])
    assert {"grpo.lr", "seed", "sampling.seed"} <= varied and "grpo.beta" not in varied
    assert r["constant_params"]["grpo.beta"] == "0.01"
    for rid in ids:
        assert r["varied_params"]["grpo.lr"][rid] == str(runs.truth[rid]["params"]["grpo.lr"])
    # Final accuracies: one row per (run, benchmark, checkpoint), the value the run was built with.
    got = {(a["run_id"], a["benchmark"], a["checkpoint"]): a["value"] for a in r["accuracies"]}
    want = {(rid, b, c): v for rid in ids for (b, c), v in runs.truth[rid]["accuracy"].items()}
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == pytest.approx(want[k])
    assert all(a["ci_low"] <= a["value"] <= a["ci_high"] for a in r["accuracies"])
    # Dynamics at the chosen steps equal the raw step rows.
    for d in r["dynamics"]:
        raw = next(s for s in runs.truth[d["run_id"]]["steps"] if s["step"] == d["step"])
        assert d["reward_mean"] == pytest.approx(raw["reward_mean"]) and d["grad_norm"] == pytest.approx(raw["grad_norm"])
    assert {(d["run_id"], d["step"]) for d in r["dynamics"]} == {(rid, s) for rid in ids for s in (1, 22, 30)}
    # Guard firings: each run's entropy flag, and the collapse that stopped one run, with its step.
    fired = {(f["run_id"], f["guard_id"], f["step"], bool(f["serious"])) for f in r["guard_firings"]}
    want_fired = {(rid, f["guard_id"], f["step"], f["serious"]) for rid in ids for f in runs.truth[rid]["firings"]}
    assert fired == want_fired
    assert r["collapsed"] == [sample_runs.COLLAPSED]
    md = (tmp_path / "training_report.md").read_text()
    assert "G-collapse" in md and sample_runs.COLLAPSED in md and "## Hyperparameters that differ" in md
    assert (tmp_path / "training_curves.png").stat().st_size > 1000


def test_default_steps_and_bad_requests(sample_warehouse, tmp_path):
    rid = sample_warehouse.runs.run_ids[0]
    r = training_run_report(tmp_path, run_ids=[rid], db=sample_warehouse.db)
    assert [d["step"] for d in r["dynamics"]] == [1, (1 + sample_runs.STEPS) // 2, sample_runs.STEPS]
    assert r["varied_params"] == {}  # one run varies nothing
    with pytest.raises(ValueError, match="not in the warehouse"):
        training_run_report(tmp_path, run_ids=[rid, "nope"], db=sample_warehouse.db)
    res = CliRunner().invoke(probe_app, ["runs", "--out", str(tmp_path / "cli"), "--experiment", "missing",
                                         "--warehouse", str(sample_warehouse.db)])
    assert res.exit_code == 2 and "no runs of experiment" in res.output
    res = CliRunner().invoke(probe_app, ["runs", "--out", str(tmp_path / "cli"), "--experiment", sample_runs.EXPERIMENT,
                                         "--warehouse", str(sample_warehouse.db)])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "cli" / "training_report.md").is_file()
