"""The probe reports end to end on tiny models: RL-Probe, Δlog p, capability boundary, the CLI, publishing."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from rlvr_cli.probe import probe_app
from rlvr_core.artifacts.storage import LocalStore
from rlvr_core.probe.boundary import BoundarySettings, accuracy_bins, run_boundary_analysis, solvable_overlap
from rlvr_core.probe.dlogp import DlogpSettings, run_dlogp_analysis
from rlvr_core.probe.report import ProbeSettings, publish, run_rl_probe, select_problems
from rlvr_core.probe.tables import (CATEGORIES_SCHEMA, CHECKPOINTS_SCHEMA, PROBLEMS_SCHEMA, TOKENS_SCHEMA,
                                    TURNING_POINTS_SCHEMA, Checkpoint)
from rlvr_core.probe.task import TaskSettings

from tests.probe.conftest import perturbed

TASK = TaskSettings(max_new_tokens=12, batch_size=64)


@pytest.fixture(scope="module")
def models(model_a, model_b, tokenizer):
    return {"a": (model_a, tokenizer), "b1": (perturbed(model_a, 0.005, 3), tokenizer),
            "b2": (model_b, tokenizer), "same": (model_a, tokenizer)}


@pytest.fixture(scope="module")
def saved(tmp_path_factory, model_a, model_b, tokenizer):
    root = tmp_path_factory.mktemp("probe-models")
    for name, m in (("base", model_a), ("rl", model_b)):
        m.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return root


def test_select_problems():
    a = {"p1": False, "p2": True, "p3": False, "p4": True}
    b = {"p1": True, "p2": True, "p3": False, "p4": False}
    assert select_problems(a, b, "a_fail_b_success") == ["p1"]
    assert select_problems(a, b, "a_success_b_fail") == ["p4"]
    assert select_problems(a, b, "both_fail") == ["p3"]
    assert select_problems(a, b, "both_success") == ["p2"]
    assert select_problems(a, b, "all") == ["p1", "p2", "p3", "p4"]
    with pytest.raises(ValueError):
        select_problems(a, b, "some")


def test_rl_probe_report(models, rows, tmp_path):
    cks = [Checkpoint("same", 0), Checkpoint("b1", 10), Checkpoint("b2", 20)]
    settings = ProbeSettings(selection="all", task=TASK, sample_figures=2)
    tables, meta = run_rl_probe(Checkpoint("a"), cks, rows["test"][:8], tmp_path, settings, models=models,
                                probe_id="p-test")
    assert meta["n_selected"] == 8 and meta["n_sequences"] == 8
    for name, schema in (("probe_tokens", TOKENS_SCHEMA), ("probe_problems", PROBLEMS_SCHEMA),
                         ("probe_checkpoints", CHECKPOINTS_SCHEMA), ("probe_categories", CATEGORIES_SCHEMA),
                         ("probe_turning_points", TURNING_POINTS_SCHEMA)):
        t = pq.read_table(tmp_path / f"{name}.parquet")
        assert t.schema.equals(schema), name
    ck = tables.checkpoints.to_pydict()
    assert ck["checkpoint"] == ["same", "b1", "b2"] and ck["step"] == [0, 10, 20]
    # the identical checkpoint: KL exactly 0, no spikes; the others move away from A in order of perturbation
    assert ck["mean_kl"][0] == 0.0 and ck["total_spikes"][0] == 0
    assert 0 < ck["mean_kl"][1] < ck["mean_kl"][2]
    pr = tables.problems.to_pydict()
    for i, name in enumerate(ck["checkpoint"]):
        assert sum(n for c, n in zip(pr["checkpoint"], pr["n_spikes"]) if c == name) == ck["total_spikes"][i]
    cat = tables.categories.to_pydict()
    for name in ck["checkpoint"][1:]:
        assert sum(n for c, n in zip(cat["checkpoint"], cat["n_tokens"]) if c == name) == ck["n_tokens"][1]
    text = (tmp_path / "report.md").read_text()
    for section in ("## Summary", "## Checkpoints", "### Turning points", "## Token categories",
                    "## Spikes per problem", "problems by spikes", "problems by mean KL", "## Method"):
        assert section in text
    for f in ("kl_distribution", "spike_analysis", "category_breakdown", "sample_kl_sequences"):
        assert (tmp_path / "figures" / f"{f}.png").stat().st_size > 1000
    assert json.loads((tmp_path / "summary.json").read_text())["probe_id"] == "p-test"
    keys = publish(tmp_path, LocalStore(tmp_path.parent / "store"), "exp/run1/probe")
    assert "exp/run1/probe/report.md" in keys and "exp/run1/probe/probe_tokens.parquet" in keys


def test_rl_probe_reuses_given_greedy_records(models, rows, tmp_path):
    """An evaluation's greedy rows (eval_samples) select the slice and are the responses: nothing is re-sampled."""
    r = rows["test"][:3]
    ev_a = [{"problem_id": x["id"], "greedy": True, "response": " 1 + 1 = 2\n#### 2", "status": "incorrect"} for x in r]
    ev_a.append({"problem_id": r[0]["id"], "greedy": False, "response": "sampled, ignored", "status": "correct"})
    ev_b = [{"problem_id": x["id"], "greedy": True, "response": "x", "status": "correct" if i else "incorrect"}
            for i, x in enumerate(r)]
    tables, meta = run_rl_probe(Checkpoint("a"), [Checkpoint("b2")], r, tmp_path, ProbeSettings(task=TASK),
                                models=models, greedy_a=ev_a, greedy_b=ev_b)
    assert meta["n_selected"] == 2 and meta["accuracy_b"] == 2 / 3
    assert set(tables.tokens.column("sequence_id").to_pylist()) == {f"{x['id']}/a_greedy/0" for x in r[1:]}


def test_empty_slice_and_bad_names(models, rows, tmp_path):
    # random models never answer correctly: no "A fails, B succeeds" problem; the report says so
    tables, meta = run_rl_probe(Checkpoint("a"), [Checkpoint("b2")], rows["test"][:4], tmp_path,
                                ProbeSettings(task=TASK), models=models)
    assert meta["n_selected"] == 0 and tables.tokens.num_rows == 0
    assert "nothing to analyse" in (tmp_path / "report.md").read_text()
    with pytest.raises(ValueError, match="distinct"):
        run_rl_probe(Checkpoint("a"), [Checkpoint("a")], rows["test"][:2], tmp_path, models=models)


def test_dlogp_analysis(models, rows, tmp_path):
    s = DlogpSettings(n_samples=2, rates=(0.2,), criteria=("dlogp", "random"), gammas=(0.0, 1.0), min_token_count=2,
                      task=TASK)
    meta = run_dlogp_analysis(Checkpoint("a"), Checkpoint("b2"), rows["test"][:6], tmp_path, s, models=models)
    repl = pq.read_table(tmp_path / "dlogp_replacement.parquet").to_pylist()
    assert [(r["criterion"], r["target_rate"]) for r in repl] == [("dlogp", 0.2), ("random", 0.2)]
    assert all(0.05 < r["replace_rate"] < 0.4 and r["n_samples"] == 12 for r in repl)
    ext = pq.read_table(tmp_path / "dlogp_extrapolation.parquet").to_pylist()
    assert len(ext) == 4 and {r["gamma"] for r in ext} == {0.0, 1.0}
    src = pq.read_table(tmp_path / "dlogp_sources.parquet").to_pylist()
    dl = {r["source"]: r["mean"] for r in src if r["metric"] == "dlogp"}
    a_mean, b_mean = (dl[k] for k in sorted(dl))  # "sampled from A …" sorts before "sampled from B …"
    assert a_mean < 0 < b_mean  # E_A[Δlog p] = -KL(A||B) <= 0 <= KL(B||A) = E_B[Δlog p]
    tops = pq.read_table(tmp_path / "dlogp_top_tokens.parquet").to_pylist()
    assert all((r["mean_dlogp"] > 0) == (r["direction"] == "B favours") for r in tops)
    assert set(meta["accuracy"]) == {"A (a)", "B (b2)"}
    for f in ("dlogp_histograms", "replacement", "extrapolation"):
        assert (tmp_path / "figures" / f"{f}.png").exists()
    assert "## Test-time extrapolation" in (tmp_path / "dlogp_report.md").read_text()


def test_boundary_analysis(models, rows, tmp_path):
    s = BoundarySettings(n_samples=4, ppl_per_problem=1, task=TASK)
    meta = run_boundary_analysis(Checkpoint("a"), Checkpoint("b2"), rows["test"][:5], tmp_path, s, models=models)
    curve = pq.read_table(tmp_path / "boundary_passk.parquet").to_pylist()
    assert sorted({r["k"] for r in curve}) == [1, 2, 4]
    assert sum(meta["overlap"].values()) == 5
    ppl = {(r["responses"], r["scored_by"]): r for r in meta["perplexity"]}
    assert ppl[("reference", "A (a)")]["n_responses"] == 5 and ppl[("reference", "A (a)")]["mean_ppl"] > 1
    assert (tmp_path / "boundary_report.md").exists() and (tmp_path / "figures" / "passk_curves.png").exists()


def test_boundary_helpers():
    rows = accuracy_bins(np.array([0.0, 0.0, 0.05, 0.1, 0.95, 1.0]))
    got = {r["bin"]: r["problems"] for r in rows}
    assert got["0"] == 2 and got["(0, 0.1)"] == 1 and got["[0.1, 0.2)"] == 1 and got["[0.9, 1)"] == 1 and got["1"] == 1
    assert sum(got.values()) == 6
    assert solvable_overlap({"a": 1, "b": 0, "c": 2, "d": 0}, {"a": 3, "b": 1, "c": 0}) == \
        {"both": 1, "only_a": 1, "only_b": 1, "neither": 1}


def test_cli_tokens_and_report(saved, rows, tmp_path):
    from rlvr_core.data.jsonl import write_jsonl

    data = tmp_path / "rows.jsonl"
    write_jsonl(rows["test"][:4], data)
    runner = CliRunner()
    r = runner.invoke(probe_app, ["tokens", "--a", str(saved / "base"), "--b", f"rl@5={saved / 'rl'}",
                                  "--data", str(data), "--out", str(tmp_path / "tok"), "--vocab-chunk", "64"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output.strip().splitlines()[-1])
    t = pq.read_table(tmp_path / "tok" / "probe_tokens.parquet")
    assert out["tokens"] == t.num_rows > 0 and set(t.column("checkpoint_b").to_pylist()) == {"rl"}
    assert set(t.column("step_b").to_pylist()) == {5}
    r = runner.invoke(probe_app, ["report", "--a", str(saved / "base"), "--b", f"rl={saved / 'rl'}", "--data", str(data),
                                  "--out", str(tmp_path / "rep"), "--selection", "all", "--max-new-tokens", "8",
                                  "--spike-rule", "zscore", "--publish", "e/r/probe",
                                  "--artifact-uri", str(tmp_path / "store")])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output.strip().splitlines()[-1])["n_selected"] == 4
    assert (tmp_path / "store" / "e" / "r" / "probe" / "report.md").exists()
    assert "mean + 3·std" in (tmp_path / "rep" / "report.md").read_text()
