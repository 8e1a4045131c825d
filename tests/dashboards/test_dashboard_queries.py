"""Each dashboard page's canned query against a small warehouse built here, checked against values
computed in Python from the raw sample data (sample_runs.py), not from SQL; t intervals against
rlvr_core.eval.compare.paired_t_interval (the one Python reference for them)."""

from __future__ import annotations

import re

import math
import statistics

import json

import pytest
import sample_runs

from rlvr_cli import records
from rlvr_core.eval.compare import paired_t_interval, t_quantile
from rlvr_core.records import warehouse
from rlvr_core.records import warehouse_queries as wq


def rec(sw, name, **params):
    return wq.records(name, params, sw.db)


def test_every_query_file_parses_and_runs(sample_warehouse):
    queries = wq.list_queries()
    assert {q.name for q in queries} >= {"leaderboard", "best_checkpoint", "ablation_pivot", "per_problem_diff",
                                         "training_curves", "guard_firings", "collapsed_runs", "passk_curves",
                                         "probe_checkpoints", "probe_categories", "probe_top_tokens"}
    required = {"run_a": "lr1e-5-s0", "run_b": "lr1e-5-s1", "run_id": sample_runs.PROBED, "runs": sample_runs.PROBED}
    for q in queries:
        assert q.description, q.path
        cols, rows = wq.run(q.name, {p.name: required[p.name] for p in q.params if p.required}, sample_warehouse.db)
        assert cols and rows, f"{q.name} returned nothing on the sample warehouse"


def test_leaderboard_is_each_runs_best_metric_and_flags_the_collapse(sample_warehouse):
    truth = sample_warehouse.runs.truth
    rows = rec(sample_warehouse, "leaderboard")
    # One row per run and benchmark (different benchmarks are different settings): the best checkpoint's value.
    assert {(r["run_id"], r["benchmark"]): r["value"] for r in rows} == {
        (rid, b): max(v for (bb, _), v in t["accuracy"].items() if bb == b)
        for rid, t in truth.items() for b in sample_runs.BENCHMARKS}
    for bench in sample_runs.BENCHMARKS:  # ranked within the group, best first
        group = [r for r in rows if r["benchmark"] == bench]
        assert len({r["settings_group"] for r in group}) == 1 and all(r["runs_in_group"] == 6 for r in group)
        assert [r["value"] for r in group] == sorted((r["value"] for r in group), reverse=True)
        assert [r["rank_in_group"] for r in group] == [1 + sum(o["value"] > r["value"] for o in group) for r in group]
    assert {r["run_id"] for r in rows if r["collapsed"]} == {sample_runs.COLLAPSED}
    one = rec(sample_warehouse, "leaderboard", benchmark="synthetic")
    assert {r["run_id"]: r["value"] for r in one} == {
        rid: max(v for (b, _), v in t["accuracy"].items() if b == "synthetic") for rid, t in truth.items()}


def test_best_checkpoint_per_benchmark(sample_warehouse):
    truth = sample_warehouse.runs.truth
    rows = rec(sample_warehouse, "best_checkpoint")
    for bench in sample_runs.BENCHMARKS:
        # value desc, then the tie-breaks the query documents: higher ci_low (same value: same), run_id, checkpoint
        cands = sorted(((-acc, rid, ck) for rid, t in truth.items() for (b, ck), acc in t["accuracy"].items()
                        if b == bench))
        best = next(r for r in rows if r["benchmark"] == bench)
        assert (-best["value"], best["run_id"], best["checkpoint"]) == cands[0]
        if best["checkpoint"] == "trained":
            assert best["checkpoint_step"] == sample_runs.STEPS and best["checkpoint_uri"].endswith("checkpoints/trained")
    trained_only = rec(sample_warehouse, "best_checkpoint", include_base=False)
    assert all(r["checkpoint"] != "base" for r in trained_only) and len(trained_only) == len(sample_runs.BENCHMARKS)


def test_ablation_pivot_groups_seeds_and_gives_student_t_intervals(sample_warehouse):
    truth = sample_warehouse.runs.truth
    rows = rec(sample_warehouse, "ablation_pivot", sweep=sample_runs.SWEEP)
    # seed, sampling.seed, name and the per-trial sweep keys are ignored: only the swept param remains
    assert {r["swept_params"] for r in rows} == {"grpo.lr"}
    # DuckDB aggregates in parallel, so the sd of the same rows can differ in the last bit between calls
    by_experiment = rec(sample_warehouse, "ablation_pivot", experiment=sample_runs.EXPERIMENT)
    assert by_experiment == [{k: pytest.approx(v, rel=1e-12) if isinstance(v, float) else v for k, v in r.items()}
                             for r in rows]
    assert rec(sample_warehouse, "ablation_pivot", sweep="another-sweep") == []
    assert len(rows) == len(sample_runs.LRS) * len(sample_runs.BENCHMARKS)
    for r in rows:
        lr = r["config"].removeprefix("grpo.lr=")
        values = [truth[f"lr{lr}-s{s}"]["accuracy"][(r["benchmark"], "trained")] for s in sample_runs.SEEDS]
        mean, lo, hi = paired_t_interval(values)
        assert r["n_seeds"] == 3 and r["runs"] == sorted(f"lr{lr}-s{s}" for s in sample_runs.SEEDS)
        assert json.loads(r["cell"]) == {"grpo.lr": lr} and r["ci_kind"] == "t over 3 seeds"
        # per seed, in seed order, with the trial ids the sweep gave them (what `rlvr sweep show` prints)
        assert r["seeds"] == list(sample_runs.SEEDS) and r["per_seed"] == values
        assert r["trial_ids"] == [f"t{sample_runs.LRS.index(lr) * 3 + s:02d}" for s in sample_runs.SEEDS]
        assert r["mean"] == pytest.approx(mean)
        assert r["sd"] == pytest.approx(statistics.stdev(values))
        assert (r["ci_low"], r["ci_high"]) == (pytest.approx(lo, abs=1e-9), pytest.approx(hi, abs=1e-9))
    base = rec(sample_warehouse, "ablation_pivot", experiment=sample_runs.EXPERIMENT, checkpoint="base",
               benchmark="synthetic")
    for r in base:
        lr = r["config"].removeprefix("grpo.lr=")
        assert r["mean"] == pytest.approx(statistics.mean(
            truth[f"lr{lr}-s{s}"]["accuracy"][("synthetic", "base")] for s in sample_runs.SEEDS))
    # Given keys define the configurations, whether they differ or not (the sweep pivot passes the sweep's).
    keyed = rec(sample_warehouse, "ablation_pivot", sweep=sample_runs.SWEEP, keys="grpo.lr,grpo.beta")
    assert [json.loads(r["cell"]) for r in keyed] == [{"grpo.beta": "0.01", **json.loads(r["cell"])} for r in rows]
    assert [(r["n_seeds"], r["mean"]) for r in keyed] == [(r["n_seeds"], pytest.approx(r["mean"])) for r in rows]
    # Without ignoring `name`, every trial is its own configuration: n = 1, the run's own (Wilson) interval.
    alone = rec(sample_warehouse, "ablation_pivot", experiment=sample_runs.EXPERIMENT, ignore="%seed%,sweep.trial_%")
    assert len(alone) == 6 * 2 and all(r["n_seeds"] == 1 and r["ci_kind"] == "wilson (1 seed)" for r in alone)
    for r in alone:
        acc = truth[r["runs"][0]]["accuracy"][(r["benchmark"], "trained")]
        half = 1.96 * math.sqrt(acc * (1 - acc) / sample_runs.N_PROBLEMS)
        assert (r["ci_low"], r["ci_high"]) == (pytest.approx(max(0.0, acc - half)), pytest.approx(min(1.0, acc + half)))


def test_ablation_interval_is_the_paired_t_interval_from_2_to_60_seeds(tmp_path):
    """The SQL's interval against rlvr_core.eval.compare.paired_t_interval on the same values, for every n from 2 to
    32 (the SQL's table of exact t values covers df 1-30; df 31 is the first of its Cornish-Fisher expansion)
    and for n = 45 and 60. Tolerances: bounds to 1e-9 from the table (its values are rounded to 1e-10);
    beyond it, the quantile itself to 2e-6 (what the SQL's comment claims for df = 31, closer above) and the
    bounds to 1e-6."""
    ns = [*range(2, 33), 45, 60]
    values = {n: [round(0.5 + 0.4 * math.sin(1.7 * i + n), 6) for i in range(n)] for n in ns}
    runs = [(f"n{n}-r{i}", n, i, v) for n, vs in values.items() for i, v in enumerate(vs)]
    db = tmp_path / "w.duckdb"
    with warehouse.writer(db) as con:
        con.executemany("INSERT INTO runs (run_id, experiment) VALUES (?, 'seeds')", [[r] for r, *_ in runs])
        con.executemany("INSERT INTO run_params VALUES (?, ?, ?)",
                        [p for r, n, i, _ in runs for p in ([r, "seed", str(i)], [r, "n", str(n)])])
        con.executemany("INSERT INTO eval_metrics (run_id, eval_id, benchmark, checkpoint, metric, value) "
                        "VALUES (?, 'e', 'b', 'final', 'accuracy_greedy', ?)", [[r, v] for r, *_, v in runs])
    rows = {r["config"]: r for r in wq.records("ablation_pivot", {"experiment": "seeds"}, db)}
    assert sorted(rows) == sorted(f"n={n}" for n in ns)
    for n in ns:
        r, (mean, lo, hi) = rows[f"n={n}"], paired_t_interval(values[n])
        assert r["n_seeds"] == n and r["ci_kind"] == f"t over {n} seeds" and r["per_seed"] == values[n]
        assert r["mean"] == pytest.approx(mean, abs=1e-12)
        tol = 1e-9 if n <= 31 else 1e-6
        assert (r["ci_low"], r["ci_high"]) == (pytest.approx(lo, abs=tol), pytest.approx(hi, abs=tol)), n
        if n > 31:
            t_sql = (r["ci_high"] - r["mean"]) / (r["sd"] / math.sqrt(n))
            assert t_sql == pytest.approx(t_quantile(0.975, n - 1), abs=2e-6), n


def test_best_checkpoint_finds_an_export_named_by_its_path(tmp_path):
    """Pipelines label an evaluation with the export's path; the export row is found all the same."""
    db = tmp_path / "w.duckdb"
    with warehouse.writer(db) as con:
        con.execute("INSERT INTO runs (run_id, experiment) VALUES ('r', 'e')")
        con.execute("INSERT INTO checkpoints (run_id, checkpoint, step, uri) VALUES "
                    "('r', 'final', 40, 's3://b/e/r/checkpoints/final'), ('r', 'step20', 20, 's3://b/e/r/checkpoints/step20')")
        con.execute("INSERT INTO eval_metrics (run_id, eval_id, benchmark, checkpoint, metric, value) VALUES "
                    "('r', 'x', 'b1', '/old/mount/e/r/checkpoints/final', 'accuracy_greedy', 0.6), "
                    "('r', 'y', 'b2', 's3://b/e/r/checkpoints/step20', 'accuracy_greedy', 0.4), "
                    "('r', 'z', 'b3', 'step20', 'accuracy_greedy', 0.3), ('r', 'w', 'b4', 'base', 'accuracy_greedy', 0.2)")
    rows = wq.records("best_checkpoint", {}, db)
    assert [(r["benchmark"], r["checkpoint_step"]) for r in rows] == [("b1", 40), ("b2", 20), ("b3", 20), ("b4", None)]


def _expected_diff(truth, run_a, ck_a, run_b, ck_b):
    out = {}
    for (bench, ck, pid), g_a in truth[run_a]["greedy"].items():
        if ck != ck_a:
            continue
        g_b = truth[run_b]["greedy"][(bench, ck_b, pid)]
        s_a, s_b = truth[run_a]["sampled"][(bench, ck_a, pid)], truth[run_b]["sampled"][(bench, ck_b, pid)]
        change = {(False, True): "fixed", (True, False): "broken", (True, True): "both_right",
                  (False, False): "both_wrong"}[(g_a, g_b)]
        out[(bench, pid)] = (change, sum(s_a) / len(s_a), sum(s_b) / len(s_b))
    return out


def test_per_problem_diff_between_two_runs_and_within_one(sample_warehouse):
    truth = sample_warehouse.runs.truth
    rows = rec(sample_warehouse, "per_problem_diff", run_a="lr1e-5-s0", run_b="lr3e-5-s1")
    want = _expected_diff(truth, "lr1e-5-s0", "trained", "lr3e-5-s1", "trained")  # default: last non-base
    assert {(r["benchmark"], r["problem_id"]): (r["change"], r["sampled_a"], r["sampled_b"]) for r in rows} == want
    assert [r["change"] for r in rows] == sorted((r["change"] for r in rows),
                                                 key=lambda c: {"fixed": 0, "broken": 1}.get(c, 2))
    within = rec(sample_warehouse, "per_problem_diff", run_a="lr1e-5-s2", run_b="lr1e-5-s2", checkpoint_a="base",
                 checkpoint_b="trained", benchmark="synthetic", only_changed=True)
    want = {k: v for k, v in _expected_diff(truth, "lr1e-5-s2", "base", "lr1e-5-s2", "trained").items()
            if k[0] == "synthetic" and v[0] in ("fixed", "broken")}
    assert want, "the sample data should have some changed problems"
    assert {(r["benchmark"], r["problem_id"]): (r["change"], r["sampled_a"], r["sampled_b"]) for r in within} == want


def test_training_curves_and_guard_firings(sample_warehouse):
    truth = sample_warehouse.runs.truth
    runs = ["lr1e-5-s0", sample_runs.COLLAPSED]
    rows = rec(sample_warehouse, "training_curves", runs=",".join(runs), metrics="reward_mean,entropy")
    assert {(r["run_id"], r["step"], r["metric"]): r["value"] for r in rows} == {
        (rid, s["step"], m): pytest.approx(s[m]) for rid in runs for s in truth[rid]["steps"] for m in ("reward_mean", "entropy")}
    everything = rec(sample_warehouse, "training_curves", runs="lr1e-5-s0", metrics="NULL")
    assert len(everything) == sample_runs.STEPS * (len(truth["lr1e-5-s0"]["steps"][0]) - 1)
    firings = rec(sample_warehouse, "guard_firings", runs=",".join(runs))
    assert [(r["run_id"], r["step"], r["guard_id"], r["serious"], r["source"]) for r in firings] == [
        (rid, f["step"], f["guard_id"], f["serious"], "firings") for rid in runs
        for f in sorted(truth[rid]["firings"], key=lambda f: f["step"])]


def test_sweeps(sample_warehouse):
    rows = rec(sample_warehouse, "sweeps")
    assert [(r["sweep"], r["experiment"], r["n_trials"]) for r in rows] == [
        (sample_runs.SWEEP, sample_runs.EXPERIMENT, len(sample_runs.LRS) * len(sample_runs.SEEDS))]


def test_collapsed_runs(sample_warehouse):
    rows = rec(sample_warehouse, "collapsed_runs")
    assert [(r["run_id"], r["tagged_collapsed"], r["stopped_at_step"], r["guard_id"]) for r in rows] == [
        (sample_runs.COLLAPSED, True, 22, "G-collapse")]
    assert rec(sample_warehouse, "collapsed_runs", experiment="other") == []


def test_passk_curves(sample_warehouse):
    truth = sample_warehouse.runs.truth
    rows = rec(sample_warehouse, "passk_curves", runs="lr1e-5-s1")
    assert [(r["source"], r["k"], r["value"]) for r in rows] == [
        (c["source"], c["k"], pytest.approx(c["value"])) for c in sorted(truth["lr1e-5-s1"]["curve"],
                                                                           key=lambda c: (c["source"], c["k"]))]
    # pass@k never decreases in k (the unbiased estimator is monotone)
    for source in {r["source"] for r in rows}:
        vals = [r["value"] for r in rows if r["source"] == source]
        assert vals == sorted(vals)


def test_probe_views(sample_warehouse):
    truth = sample_warehouse.runs.truth[sample_runs.PROBED]
    tokens, tables = truth["probe_tokens"], truth["probe_tables"]
    cats = rec(sample_warehouse, "probe_categories", run_id=sample_runs.PROBED)
    assert len(cats) == len(tables["probe_categories"])
    for r in cats:  # the probe's own numbers, against the token rows they summarise (kl_ba by default)
        mine = [t for t in tokens if t["category"] == r["category"] and t["checkpoint_b"] == r["checkpoint"]]
        assert r["n_tokens"] == len(mine)
        assert r["mean_kl"] == pytest.approx(statistics.mean(t["kl_ba"] for t in mine))
        assert r["n_spikes"] == sum(t["is_spike"] for t in mine)
    traj = rec(sample_warehouse, "probe_checkpoints")
    assert [(r["run_id"], r["checkpoint"], r["step"]) for r in traj] == [
        (sample_runs.PROBED, f"step{s}", s) for s in (10, 20, 30)]
    for r in traj:
        mine = [t for t in tokens if t["checkpoint_b"] == r["checkpoint"]]
        assert r["n_tokens"] == len(mine)
        assert r["token_mean_kl"] == pytest.approx(statistics.mean(t["kl_ba"] for t in mine))
    turning: dict[int, list[str]] = {}
    for t in sorted(tables["probe_turning_points"], key=lambda t: t["series"]):
        turning.setdefault(t["step"], []).append(f"{t['series']} {t['kind']}")
    assert "mean_kl peak" in turning[20]  # the sample's KL rises to step 20 and falls after
    assert {r["step"]: r["turning_points"] for r in traj if r["turning_points"]} == {
        s: ", ".join(v) for s, v in turning.items()}
    top = rec(sample_warehouse, "probe_top_tokens", run_id=sample_runs.PROBED, checkpoint="step30", limit=5)
    want = sorted((t for t in tokens if t["checkpoint_b"] == "step30"), key=lambda t: -t["kl_sym"])[:5]
    assert [(r["problem_id"], r["position"], r["token_text"]) for r in top] == [
        (t["problem_id"], t["position"], t["token_text"]) for t in want]
    assert len(rec(sample_warehouse, "probe_top_tokens", run_id=sample_runs.PROBED)) == 50


def test_bad_queries_and_parameters_are_named(sample_warehouse, tmp_path):
    with pytest.raises(wq.QueryError, match="no canned query 'nope'.*leaderboard"):
        wq.load("nope")
    with pytest.raises(wq.QueryError, match=r"per_problem_diff\.sql: parameter 'run_a' \(text\) is required"):
        wq.run("per_problem_diff", {"run_b": "x"}, sample_warehouse.db)
    with pytest.raises(wq.QueryError, match=r"leaderboard\.sql: no parameter 'metrc'"):
        wq.run("leaderboard", {"metrc": "x"}, sample_warehouse.db)
    with pytest.raises(wq.QueryError, match=r"probe_top_tokens\.sql: parameter 'limit' expects int"):
        wq.run("probe_top_tokens", {"run_id": "x", "limit": "many"}, sample_warehouse.db)
    with pytest.raises(wq.QueryError, match="expected NAME=VALUE"):
        wq.parse_cli_params(["run_id"])
    assert wq.parse_cli_params(["run_id=a=b", "limit=3"]) == {"run_id": "a=b", "limit": "3"}
    (tmp_path / "q.sql").write_text("-- about\n-- param x: int = 1 | a number\nSELECT $y\n")
    with pytest.raises(wq.QueryError, match=r"q\.sql:3: \$y is used but not declared"):
        wq.load("q", tmp_path)
    (tmp_path / "q.sql").write_text("-- about\n-- param x: int = 1 | a number\nSELECT 1\n")
    with pytest.raises(wq.QueryError, match=r"q\.sql: parameter 'x' is declared but the SQL never uses"):
        wq.load("q", tmp_path)
    (tmp_path / "q.sql").write_text("-- about\n-- param x: integer | a number\nSELECT $x\n")
    with pytest.raises(wq.QueryError, match=r"q\.sql:2: parameter 'x' has unknown type 'integer'"):
        wq.load("q", tmp_path)


def test_warehouse_commands(sample_warehouse, tmp_path, monkeypatch):
    """`rlvr warehouse query --canned … --param …` and `rlvr warehouse ingest --all`, as rlvr_cli.main registers them."""
    import json

    import typer
    from typer.testing import CliRunner

    app = typer.Typer()
    app.command("query")(records.query_command)
    app.command("ingest")(records.ingest_command)
    runner = CliRunner()
    monkeypatch.setenv("RLVR_WAREHOUSE", str(sample_warehouse.db))
    out = runner.invoke(app, ["query", "--canned", "collapsed_runs", "--json"])
    assert out.exit_code == 0, out.output
    assert [r["run_id"] for r in json.loads(out.stdout)] == [sample_runs.COLLAPSED]
    out = runner.invoke(app, ["query", "--canned", "per_problem_diff", "--param", "run_a=lr1e-5-s0",
                              "--param", "run_b=lr3e-5-s1", "--param", "only_changed=true", "--json"])
    assert json.loads(out.stdout) == rec(sample_warehouse, "per_problem_diff", run_a="lr1e-5-s0", run_b="lr3e-5-s1",
                                         only_changed=True)
    table = runner.invoke(app, ["query", "--canned", "leaderboard"])
    assert table.exit_code == 0 and "lr3e-5-s1" in table.stdout.splitlines()[2]  # header, rule, best run
    assert "per_problem_diff:" in runner.invoke(app, ["query", "--list"]).stdout
    # The ablation pivot as a table: its means and intervals rounded (4 significant digits), not 17 digits.
    pivot = runner.invoke(app, ["query", "--canned", "ablation_pivot", "--param", f"sweep={sample_runs.SWEEP}"])
    assert pivot.exit_code == 0, pivot.output
    first = rec(sample_warehouse, "ablation_pivot", sweep=sample_runs.SWEEP)[0]
    assert f"{first['mean']:.4g}" in pivot.stdout.splitlines()[2] and not re.search(r"\d\.\d{6,}", pivot.stdout), \
        pivot.stdout
    bad = runner.invoke(app, ["query", "--canned", "per_problem_diff", "--param", "run_a=x"])
    assert bad.exit_code == 2 and "parameter 'run_b' (text) is required" in bad.output
    assert runner.invoke(app, ["query", "select 1", "--canned", "leaderboard"]).exit_code == 2
    plain = runner.invoke(app, ["query", "select count(*) as n from runs", "--json"])
    assert json.loads(plain.stdout) == [{"n": 6}]

    monkeypatch.setenv("RLVR_WAREHOUSE", str(tmp_path / "fresh.duckdb"))
    store = str(sample_warehouse.runs.store.root)
    first = runner.invoke(app, ["ingest", "--all", "--artifact-uri", store])
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout)["ingested"] == sorted(sample_warehouse.runs.run_ids)
    again = json.loads(runner.invoke(app, ["ingest", "--all", "--artifact-uri", store]).stdout)
    assert again["ingested"] == [] and len(again["skipped"]) == 6
    one = runner.invoke(app, ["ingest", f"{sample_runs.EXPERIMENT}/{sample_runs.PROBED}", "--artifact-uri", store,
                              "--force"])
    assert json.loads(one.stdout)["probe_tokens"] == len(sample_warehouse.runs.truth[sample_runs.PROBED]["probe_tokens"])
    missing = runner.invoke(app, ["ingest", "exp/none", "--artifact-uri", store])
    assert missing.exit_code == 1 and "no run.json" in missing.output


def _eval_run(store, run_id: str, value: float, **settings) -> None:
    """A run folder holding one evaluation's metric row, with the evaluator's settings JSON."""
    import json

    import pyarrow as pa

    from rlvr_core.records.runrecord import upload_run_folder, write_run_folder

    full = {"benchmark": "synthetic", "n_problems": 40, "n": 4, "template": "plain", "temperature": 1.0,
            "max_new_tokens": 48, "seed": 0, "batch_size": 64, "verifier_workers": 2, **settings}
    metrics = pa.Table.from_pylist([{"eval_id": "e", "benchmark": "synthetic", "checkpoint": "c", "metric":
                                     "accuracy_greedy", "value": value, "n": full["n_problems"], "ci_low": 0.0,
                                     "ci_high": 1.0, "settings": json.dumps(full, sort_keys=True)}])
    local = write_run_folder(store.root.parent / "local" / run_id, run={"run_id": run_id, "experiment": "lb"},
                             params={}, manifest={}, config_yaml="", summary={},
                             tables={"evals/metrics.parquet": metrics})
    upload_run_folder(store, f"lb/{run_id}", local)


def test_leaderboard_never_ranks_different_settings_together(tmp_path):
    """n = 40 against n = 200 problems (or another template, temperature, max tokens) are different groups, as
    `rlvr compare` would refuse the pair; batch size, verifier workers and thread count (COMPARE_EXEMPT) are not."""
    import re

    from rlvr_core.eval.metrics import COMPARE_EXEMPT
    from rlvr_core.artifacts.storage import LocalStore

    store = LocalStore(tmp_path / "store")
    _eval_run(store, "small", 0.9)
    _eval_run(store, "big", 0.6, n_problems=200)
    _eval_run(store, "big-fast", 0.7, n_problems=200, batch_size=256, verifier_workers=0,
              numerics={"torch_threads": 1, "cpu_capability": "AVX2", "torch_version": "2.0"})
    _eval_run(store, "other-template", 0.95, n_problems=200, template="qwen-boxed")
    _eval_run(store, "short", 0.8, n_problems=200, max_new_tokens=16)
    _eval_run(store, "hot", 0.85, n_problems=200, temperature=0.6)
    warehouse.ingest_all(store, tmp_path / "w.duckdb")
    rows = {r["run_id"]: r for r in wq.records("leaderboard", {}, tmp_path / "w.duckdb")}
    groups = {rid: r["settings_group"] for rid, r in rows.items()}
    assert groups["big"] == groups["big-fast"]
    assert len({groups[k] for k in ("small", "big", "other-template", "short", "hot")}) == 5
    assert (rows["big-fast"]["rank_in_group"], rows["big"]["rank_in_group"]) == (1, 2)
    assert rows["small"]["rank_in_group"] == 1 and rows["small"]["runs_in_group"] == 1
    assert (rows["big"]["n_problems"], rows["small"]["n_problems"], rows["short"]["max_new_tokens"],
            rows["hot"]["temperature"], rows["other-template"]["template"]) == (200, 40, 16, 0.6, "qwen-boxed")
    # The query's exempt keys are exactly the comparison's (rlvr_core.eval.evaluate.COMPARE_EXEMPT).
    sql = wq.load("leaderboard").sql
    assert set(re.findall(r'"(\w+)": null', sql)) == set(COMPARE_EXEMPT)
