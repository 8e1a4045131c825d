"""End to end on a real local stack: Prefect server (on PostgreSQL, as `rlvr stack up` runs it) + process workers
on 127.0.0.1 (flows/local_stack.py), deployments from infra/prefect/prefect.yaml, driven with the `prefect` CLI
like a user would.

One stack for the module (its start-up and the tiny base model are paid once):
1. `rlvr sweep run demo-lr --watch` (2 cells x 2 seeds): one MLflow parent with four child runs,
   a two-row warehouse pivot with t intervals across seeds, one shared pass-rate table, and the effect the
   sweep ships to show: every trial at the demo's lr beats every trial at a tenth of it beyond their intervals.
2. `nightly-eval`: a deployment run and a direct flow run at once evaluate the four new checkpoints once between
   them (claims); two deployment runs created together: one is cancelled (concurrency limit 1), the other finds
   nothing new and ends in seconds.
3. Fault injection: the GPU worker's process group (worker, trial flow run, trainer) is SIGKILLed
   after the trainer's first checkpoint; a new worker starts; the lost-worker automation marks the run
   Crashed, the sweep launches the trial again, and it resumes from the checkpoint: the step count
   continues and the warehouse holds each step once.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from datetime import datetime
from html.parser import HTMLParser
import uuid
from pathlib import Path

import pytest
import yaml

from flows.local_stack import GPU_POOL, ROOT, prefect_down, prefect_up, stack_env, start_worker, stop_pid
from tests.mlflow_server import start_mlflow
from tests.prefect_postgres import prefect_database

pytestmark = pytest.mark.slow

SWEEP_SET = yaml.safe_load((ROOT / "configs" / "sweeps" / "demo_lr.yaml").read_text())["set"]
# The nightly evaluation's suite is the sweep trials' own (data and eval settings), so their numbers compare.
TINY_EVAL = {k: v for k, v in SWEEP_SET.items() if k.startswith(("data.", "eval."))}


@pytest.fixture(scope="module")
def stack(tmp_path_factory, monkeypatch_module, demo_stage_cache):
    home = tmp_path_factory.mktemp("stack")
    # An MLflow tracking server (as on a team stack) over the sqlite file the tests also read directly:
    # flows and `rlvr sweep` get MLFLOW_TRACKING_URI through stack_env, so links point at its UI.
    mlflow = start_mlflow(home)
    monkeypatch_module.setenv("MLFLOW_TRACKING_URI", mlflow["url"])
    # The lost-worker automation waits the shortest it accepts (flows/local_stack.py: one heartbeat interval plus
    # the longest a SQLite-backed server stalls); this server is on PostgreSQL, which does not stall like that.
    monkeypatch_module.setenv("RLVR_LOST_AFTER_S", "90")
    try:
        with prefect_database(home) as database_url:  # PostgreSQL, as `rlvr stack up` runs it
            state = prefect_up(home, database_url=database_url)
            state["mlflow_url"] = mlflow["url"]
            try:
                # The demo's data and base model, built once per test session (shared with
                # tests/e2e/test_demo_vllm.py): the sweep's shared stages find them cached. Seeded after the servers
                # start, so the two overlap.
                demo_stage_cache.seed(home)
                yield state
            finally:
                prefect_down(state)
    finally:
        stop_pid(mlflow["pid"])


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def prefect_cli(state, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = stack_env(Path(state["home"]), state["api_url"])
    return subprocess.run([str(Path(os.sys.executable).parent / "prefect"), *args], env=env, cwd=str(ROOT),
                          capture_output=True, text=True, timeout=timeout)


def mlflow_client(state):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{Path(state['home']) / 'mlflow' / 'mlflow.db'}")


def wh(state, sql, params=None):
    from rlvr_core.records import warehouse

    return warehouse.query_records(sql, params, Path(state["home"]) / "warehouse.duckdb")


def sweep_runs(state, sweep_name):
    c = mlflow_client(state)
    exp = c.get_experiment_by_name("rlvr-sweeps")
    parents = c.search_runs([exp.experiment_id], f"tags.kind = 'sweep' and tags.sweep_name = '{sweep_name}'")
    assert len(parents) == 1, [p.data.tags for p in parents]
    children = c.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parents[0].info.run_id}'")
    return parents[0], children


def rlvr_cli(state, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    """`rlvr ...` as a user of the stack runs it: the stack's environment (PREFECT_API_URL, RLVR_HOME, MLflow)."""
    env = stack_env(Path(state["home"]), state["api_url"])
    return subprocess.run([str(Path(os.sys.executable).parent / "rlvr"), *args], env=env, cwd=str(ROOT),
                          capture_output=True, text=True, timeout=timeout)


# The first test of the module also pays the stack's setup, which now includes waiting for the session's shared
# demo base model (demo_stage_cache, built once on whichever worker asks first): more than the default 900 s on a
# loaded machine (2026-11-28 at load ~9: 254 s setup + the sweep 16 min, cut at 900 s ten seconds before its end).
@pytest.mark.timeout(1800)
def test_sweep_through_the_cli_shows_the_lr_effect(stack):
    # The shipped demo sweep with two seeds (CI time: 4 trials instead of 6; the full file is validated by
    # tests/core/test_sweep_cli.py and its 3-seed pivot is in docs/orchestration.md).
    proc = rlvr_cli(stack, "sweep", "run", "demo-lr", "--set", "seeds=[0,1]", "--watch")
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-5000:]
    parent, children = sweep_runs(stack, "demo-lr")
    assert parent.info.status == "FINISHED"
    assert len(children) == 4 and all(c.info.status == "FINISHED" for c in children)
    assert sorted(c.data.tags["trial_id"] for c in children) == [f"t{i:02d}" for i in range(4)]
    assert {(float(c.data.params["grpo.lr"]), int(c.data.params["seed"])) for c in children} == {
        (lr, s) for lr in (3e-5, 3e-4) for s in (0, 1)}
    # MLflow run names say what differs, in short keys (not a common "<sweep id>/..." prefix).
    assert sorted(c.info.run_name for c in children) == sorted(
        f"lr={lr} seed={s}" for lr in ("3e-05", "0.0003") for s in (0, 1))
    # Every trial came within 5 % of the lr its cell compares (the cosine begins after 2 warm-up steps), never above.
    for c in children:
        lr = float(c.data.params["grpo.lr"])
        lrs = [r["value"] for r in wh(stack, "select value from train_steps where run_id = ? and metric = 'lr'",
                                      [c.info.run_id])]
        assert len(lrs) == SWEEP_SET["grpo.steps"] and 0.95 * lr < max(lrs) <= lr * (1 + 1e-9), lrs
    sweep_id = parent.data.tags["sweep_id"]
    from flows.ablation_sweep import sweep_pivot

    pivot = sweep_pivot(sweep_id, ["grpo.lr"], path=Path(stack["home"]) / "warehouse.duckdb")
    assert len(pivot) == 2 and all(r["n_seeds"] == 2 and r["ci_kind"] == "t over 2 seeds"
                                   and r["ci_low"] <= r["mean"] <= r["ci_high"] for r in pivot)
    # Each cell's number is the mean of its two child runs' trained greedy accuracies.
    by_trial = {c.data.tags["trial_id"]: c.data.metrics["eval/synthetic/trained/accuracy_greedy"] for c in children}
    for r in pivot:
        assert r["per_seed"] == [by_trial[t] for t in r["trial_ids"]] and r["seeds"] == [0, 1]
        assert abs(r["mean"] - sum(r["per_seed"]) / 2) < 1e-12
    _assert_lr_effect(pivot)
    _assert_printed_pivot(out, pivot, parent, stack)
    # MLflow (docs/tracking.md): each trial run holds its own training curves; the sweep's saved view lists exactly
    # its trials (no stage run, no sweep run), grouped by the swept params, the pivot's metric charted first.
    c = mlflow_client(stack)
    for ch in children:
        assert sorted(m.step for m in c.get_metric_history(ch.info.run_id, "train/reward_mean")) == \
            list(range(1, SWEEP_SET["grpo.steps"] + 1))
    exp = c.get_experiment(parent.info.experiment_id)
    view = json.loads(json.loads(exp.tags[f"mlflow.sharedViewState.sweep-{sweep_id}"])["state"])
    assert sorted(r.info.run_id for r in c.search_runs([exp.experiment_id], view["searchFilter"])) == \
        sorted(ch.info.run_id for ch in children)
    assert len(c.search_runs([exp.experiment_id], f"tags.sweep_id = '{sweep_id}' and tags.kind = 'stage'")) >= 4 * 7
    assert view["compareRunCharts"][0]["metricKey"] == "eval/synthetic/trained/accuracy_greedy" == \
        exp.tags["mlflow.experiment.primaryMetric.name"]  # the metric the pivot averaged above
    assert [k["groupByData"] for k in view["groupBy"]["groupByKeys"]] == ["grpo.lr"]
    # `rlvr sweep show` prints the same table from the warehouse alone (no Prefect), by sweep name.
    show = rlvr_cli(stack, "sweep", "show", "demo-lr")
    assert show.returncode == 0 and show.stdout.splitlines()[1:] == out.splitlines()[1:1 + len(pivot) + 3], \
        show.stdout + show.stderr
    # The artifact store reads as the sweep (docs/artifacts.md): rlvr-sweeps/<sweep id>/ holds the sweep's page
    # and pivot, and a folder per trial named by what differs, each with its own page.
    from urllib.parse import quote

    sweep_dir = Path(stack["home"]) / "artifacts" / "rlvr-sweeps" / sweep_id
    page = (sweep_dir / "index.html").read_text()
    trials = sorted(p.parent.name for p in sweep_dir.glob("*/run.json"))
    assert [t.split("_", 1)[0] for t in trials] == sorted(c.data.tags["trial_id"] for c in children)
    assert all("lr=" in t and "seed=" in t for t in trials), trials
    for t in trials:
        assert (sweep_dir / t / "index.html").is_file() and f'href="{quote(t)}/index.html"' in page
    assert len(json.loads((sweep_dir / "pivot.json").read_text())) == len(pivot)
    # The shared stage ran once: every trial trained on the same pass-rate table, which is one cache entry.
    tables = wh(stack, "select distinct table_id from pass_rate_tables p join runs r using (run_id) where r.kind = 'trial'")
    assert len(tables) == 1
    assert len(list((Path(stack["home"]) / "cache" / "pass_rate_table").glob("[0-9a-f]*"))) == 1
    assert wh(stack, "select count(*) as n from runs where kind = 'trial'") == [{"n": 4}]
    # Each trial's run holds its rollout traces, read through the tracking server (tracking.traces: the evaluation
    # steps 5 and 10, the first 4 groups of each), with the warehouse's rewards for the same completions.
    from mlflow.tracking import MlflowClient

    server = MlflowClient(stack["mlflow_url"])
    for c in children:
        traces = server.search_traces(locations=[c.info.experiment_id], run_id=c.info.run_id,
                                      filter_string="tags.`rlvr.kind` = 'rollout'", max_results=100)
        steps = sorted(int(t.info.tags["step"]) for t in traces)
        # 4 groups of each evaluation step; a step a guard flagged has all its 16 groups
        assert steps.count(5) in (4, 16) and steps.count(10) in (4, 16), steps
        rows = {(r["step"], r["prompt_id"], r["sample_index"]): r["reward"] for r in wh(
            stack, "select step, prompt_id, sample_index, reward from rollout_samples where run_id = ?",
            [c.info.run_id])}
        roots = [(t, next(s for s in t.data.spans if s.parent_id is None)) for t in traces]
        seen = [(rows[k], out["reward"]) for t, root in roots for out in root.outputs
                if (k := (int(t.info.tags["step"]), t.info.tags["prompt_id"], out["sample_index"])) in rows]
        assert seen and all(a == b for a, b in seen)


def test_artifacts_open_takes_what_the_sweep_printed(stack):
    """Each form `rlvr sweep` prints at its end (`status` prints the same ending as `run --watch`): the sweep
    id, the `artifacts:` folder (as printed, with its trailing slash, and without), the MLflow parent run's
    page and id, the Prefect flow run id, opens the sweep's index.html; a trial's MLflow run id opens the
    trial's page; `ls` by sweep id groups the sweep's files and each trial's."""
    import re

    from typer.testing import CliRunner

    from rlvr_cli.artifacts import artifacts_app

    status = rlvr_cli(stack, "sweep", "status", "demo-lr")
    out = status.stdout
    assert status.returncode == 0, out[-2000:] + status.stderr[-2000:]
    sweep_id = re.search(r"^sweep (\S+): Completed$", out, re.M).group(1)
    flow_run_id = re.search(r"^sweep demo-lr: flow run \S+ \(([0-9a-f-]{36})\)", out, re.M).group(1)
    folder = re.search(r"^artifacts: (.+)$", out, re.M).group(1)
    page_url = re.search(r"^MLflow parent run: (\S+)$", out, re.M).group(1)
    parent, children = sweep_runs(stack, "demo-lr")
    env = {"RLVR_HOME": stack["home"], "MLFLOW_TRACKING_URI": stack["mlflow_url"], "RLVR_ARTIFACT_URI": None}

    def open_(ref: str) -> str:
        res = CliRunner().invoke(artifacts_app, ["open", ref, "--print"], env=env)
        assert res.exit_code == 0, (ref, res.output)
        return res.output.strip().splitlines()[-1]

    sweep_page = str(Path(stack["home"]) / "artifacts" / "rlvr-sweeps" / sweep_id / "index.html")
    for ref in (sweep_id, folder, folder.rstrip("/"), page_url, parent.info.run_id, flow_run_id):
        assert open_(ref) == sweep_page, ref
    trial = next(c for c in children if c.data.tags["trial_id"] == "t01")
    assert re.fullmatch(re.escape(str(Path(sweep_page).parent)) + r"/t01_[^/]+/index\.html", open_(trial.info.run_id))
    ls = CliRunner().invoke(artifacts_app, ["ls", sweep_id], env=env)
    rows = [ln.split() for ln in ls.output.strip().splitlines()[:-1]]
    assert [r[0] for r in rows] == ["sweep", "run", "run", "run", "run"], ls.output
    assert rows[0][1] == f"rlvr-sweeps/{sweep_id}/" and all(int(r[2]) > 5 for r in rows[1:]), ls.output


def test_the_sweep_in_a_browser(stack):
    """What a person sees (Debian's chromium): the runs view opens MLflow's runs table (not the GenAI page) with
    the sweep's parent run and no stage run; the sweep's view (the compare link) charts the pivot metric per cell
    and the training curves; a trial run's own metrics hold its curves; the sweep's index page and a trial's
    index page, opened as files, draw their figures."""
    from rlvr_core.records.tracking import Tracker
    from tests.dashboards.browser import page, screenshot

    parent, children = sweep_runs(stack, "demo-lr")
    names = sorted(c.info.run_name for c in children)
    tracker = Tracker("rlvr-sweeps", tracking_uri=stack["mlflow_url"])
    with page(width=1600, height=1000) as (pg, errors):
        pg.goto(tracker.view_url(charts=False))  # the runs without stage runs: the sweep run, its trials under it
        pg.get_by_text(parent.info.run_name).first.wait_for(timeout=90_000)
        assert pg.get_by_text("rlvr: runs (no stage runs)").count() >= 1  # MLflow lists the saved view by name
        screenshot(pg, "mlflow_sweep_runs.png")
        # Each link in a page of its own, as a person opens it from the terminal.
        pg = pg.context.browser.new_page(viewport={"width": 1600, "height": 1000})
        pg.goto(tracker.view_url(f"sweep-{parent.data.tags['sweep_id']}"))  # the link `rlvr sweep run` prints
        pg.get_by_text("Sweep pivot: accuracy_greedy").first.wait_for(timeout=90_000)
        pg.get_by_text("train/reward_mean").first.wait_for(timeout=90_000)  # a chart, drawn from the trials' curves
        for n in names:  # one group per cell, each with its seeds
            pg.get_by_text(n).first.wait_for(timeout=30_000)
        screenshot(pg, "mlflow_sweep_compare.png")
        trial = next(c for c in children if c.data.tags["trial_id"] == "t00")
        pg = pg.context.browser.new_page(viewport={"width": 1600, "height": 1000})
        pg.goto(tracker.run_url(trial.info.run_id).replace(f"/runs/{trial.info.run_id}",
                                                           f"/runs/{trial.info.run_id}/model-metrics"))
        pg.get_by_placeholder("Search metric charts").fill("train/")  # the run's own training curves
        pg.get_by_text("completion_len_mean", exact=True).first.wait_for(timeout=90_000)
        pg.get_by_text("Step", exact=True).first.wait_for(timeout=90_000)  # a curve drawn (its x axis), not a spinner
        screenshot(pg, "mlflow_trial_curves.png")
        # Our pages in a page of their own: MLflow's UI logs its own 404s (a telemetry worker), not ours to judge.
        own: list[str] = []
        pg = pg.context.browser.new_page(viewport={"width": 1600, "height": 1000})
        pg.on("console", lambda m: own.append(m.text) if m.type == "error" else None)
        pg.on("pageerror", lambda e: own.append(str(e)))
        pg.on("requestfailed", lambda r: own.append(r.url))
        sweep_dir = Path(stack["home"]) / "artifacts" / "rlvr-sweeps" / parent.data.tags["sweep_id"]
        pg.goto((sweep_dir / "index.html").as_uri())
        assert pg.locator("svg").count() >= 1 and pg.locator("svg").first.bounding_box()["height"] > 50
        assert pg.locator("a[href$='index.html']").count() >= len(children)
        screenshot(pg, "sweep_index.png")
        pg.locator("a[href$='index.html']").first.click()
        pg.wait_for_load_state()
        assert pg.url.endswith("/index.html") and pg.url != (sweep_dir / "index.html").as_uri()
        assert pg.locator("svg").count() >= 1 and pg.locator("svg").first.bounding_box()["height"] > 50
        screenshot(pg, "trial_index.png")
        assert own == [], own  # our pages, opened on their own, load nothing that fails


def test_a_rollout_trace_in_the_browser(stack):
    """A trial's rollout traces in MLflow's UI (Debian's chromium): the run's Traces tab lists them, and a trace
    opens on its group: the prompt, each completion with its reward and verdict, the sample and verify spans."""
    from rlvr_core.records.tracking import Tracker
    from tests.dashboards.browser import page, screenshot

    _, children = sweep_runs(stack, "demo-lr")
    trial = next(c for c in children if c.data.tags["trial_id"] == "t01")
    tracker = Tracker("rlvr-sweeps", tracking_uri=stack["mlflow_url"])
    with page(width=1600, height=1000) as (pg, errors):
        pg.goto(tracker.run_url(trial.info.run_id).replace(f"/runs/{trial.info.run_id}",
                                                           f"/runs/{trial.info.run_id}/traces"))
        pg.get_by_text("Question:").first.click(timeout=90_000)  # a trace's request: its prompt
        pg.get_by_text("verify", exact=True).first.wait_for(timeout=60_000)
        assert pg.get_by_text("sample", exact=True).count() >= 1
        pg.get_by_text("reward").first.wait_for(timeout=30_000)
        assert pg.get_by_text("finish_reason").count() >= 1 and pg.get_by_text("weight_version").count() >= 1
        screenshot(pg, "mlflow_rollout_trace.png")


def _wilson(k: float, n: int, z: float = 1.959964) -> tuple[float, float]:
    p = k / n
    mid, half = (p + z * z / (2 * n)) / (1 + z * z / n), z * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5 / (1 + z * z / n)
    return mid - half, mid + half


def _assert_lr_effect(pivot: list[dict]) -> None:
    """The demo's lr learns within the steps and a tenth of it does not: every trial of the big lr lies above
    every trial of the small one beyond both trials' 95% Wilson intervals over the held-out problems. (With two
    seeds the pivot's t interval, t = 12.7, is too wide to say so; the shipped 3-seed pivot separates them too.)"""
    small, big = sorted(pivot, key=lambda r: float(r["grpo.lr"]))
    n = small["n_problems"]
    assert n == big["n_problems"] == 200
    for a in big["per_seed"]:
        for b in small["per_seed"]:
            assert _wilson(a * n, n)[0] > _wilson(b * n, n)[1], (big["per_seed"], small["per_seed"])
    assert big["mean"] - small["mean"] > 0.1, pivot


def _assert_printed_pivot(out: str, pivot: list[dict], parent, stack) -> None:
    """`rlvr sweep run --watch` ends with the pivot (a row per cell: values, seeds, mean, 95% CI, per-seed values),
    the MLflow parent run's page on the tracking server, and the sweep's folder in the artifact store."""
    lines = out.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("lr "))
    assert lines[head].split() == ["lr", "seeds", "mean", "accuracy_greedy", "95%", "CI", "per", "seed"]
    for r, line in zip(pivot, lines[head + 2:head + 2 + len(pivot)]):
        cell = line.split()
        assert cell[:2] == [f"{float(r['grpo.lr']):g}", "2"], line
        assert f"{r['mean']:.3f}" == cell[2] and f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}]" in line, line
        assert ", ".join(f"{v:.3f}" for v in r["per_seed"]) + "  (seeds 0, 1)" in line, line
    assert "95% CI: t over 2 seeds" in lines[head + 2 + len(pivot)]
    exp = parent.info.experiment_id
    link = f"MLflow parent run: {stack['mlflow_url']}/#/experiments/{exp}/runs/{parent.info.run_id}"
    assert any(ln == link or ln.startswith(link + "?") for ln in lines), out[-2000:]  # (+ the runs-view query)
    compare = next(ln for ln in lines if ln.startswith("MLflow compare view: "))  # the sweep's saved view
    assert compare == (f"MLflow compare view: {stack['mlflow_url']}/#/experiments/{exp}/runs?workflowType="
                       f"machine_learning&viewStateShareKey=sweep-{parent.data.tags['sweep_id']}&compareRunsMode=CHART")
    sweep_dir = Path(stack["home"]) / "artifacts" / "rlvr-sweeps" / parent.data.tags["sweep_id"]
    assert f"artifacts: {sweep_dir}/" in lines, out[-2000:]


def test_sweep_cli_errors_in_one_line(stack, tmp_path):
    # A bad sweep file: one line naming the file and the field, exit 2, nothing submitted.
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"name": "bad-1", "base": str(ROOT / "configs" / "demo.yaml"),
                                   "grid": {"grpo.learnig_rate": [1e-5]}}))
    proc = rlvr_cli(stack, "sweep", "run", str(bad))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"invalid sweep: {bad}: grid.grpo.learnig_rate: not a field of the experiment config"], proc.stderr
    assert rlvr_cli(stack, "sweep", "status", "bad-1").returncode == 2  # no such flow run on the server
    # A trial that fails on the worker (its trainer's log-prob guard trips at step 1): the sweep fails, and
    # the watch ends with the trial's final error in one line, no traceback; `status` says the same.
    demo = yaml.safe_load((ROOT / "configs" / "sweeps" / "demo_lr.yaml").read_text())
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump({"name": "broken-1", "base": str(ROOT / "configs" / "demo.yaml"),
                                      "set": {**demo["set"], "grpo.logprob_temperature": 2.0},
                                      "grid": {"grpo.lr": [2.0e-5]}}))
    proc = rlvr_cli(stack, "sweep", "run", str(broken), "--watch")
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    assert last.startswith("sweep Failed: trial t00 (lr=2e-05 seed=0) failed: ") and "G-logprob-temp" in last, last
    status = rlvr_cli(stack, "sweep", "status", "broken-1")
    assert status.returncode == 1 and status.stderr.strip().splitlines()[-1] == last, status.stdout + status.stderr
    assert any(ln.split()[:1] == ["t00"] and "G-logprob-temp" in ln for ln in status.stdout.splitlines()), status.stdout
    parent, _ = sweep_runs(stack, "broken-1")
    assert parent.info.status == "FAILED" and "G-logprob-temp" in parent.data.tags["error"]


def _api(state, path: str, body: dict | None = None, tries: int = 5):
    """POST to the Prefect API. A 503 is retried, as Prefect's own client does: the test server's SQLite answers
    it while another writer holds the database ("database is locked"), and the write was rolled back."""
    for attempt in range(tries):
        req = urllib.request.Request(state["api_url"] + path, data=json.dumps(body or {}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            if e.code != 503 or attempt == tries - 1:
                raise
            time.sleep(1 + attempt)


def _nightly_deployment_run(state) -> str:
    dep = _api(state, "/deployments/filter", {"deployments": {"name": {"any_": ["nightly"]}}})[0]
    return _api(state, f"/deployments/{dep['id']}/create_flow_run", {"parameters": {"overrides": TINY_EVAL}})["id"]


def _wait_final(state, ids: list[str], timeout_s: float = 600) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        runs = _api(state, "/flow_runs/filter", {"flow_runs": {"id": {"any_": ids}}})
        if len(runs) == len(ids) and all(r["state_type"] in ("COMPLETED", "FAILED", "CANCELLED", "CRASHED")
                                         for r in runs):
            return sorted(runs, key=lambda r: r["state_type"])
        time.sleep(1)
    raise AssertionError(f"flow runs not final after {timeout_s:.0f} s: {[r['state_type'] for r in runs]}")


def _completed_tasks(state, flow_run_ids: list[str], names: tuple[str, ...], expect: int,
                     timeout_s: float = 90) -> dict[str, int]:
    """{task name: completed task runs of these flow runs}, once each reaches `expect` or at the deadline. Prefect
    records task-run states from the client's events, after the flow run's own final state: under load (CI) the
    last task's Completed reached the server after its flow run read COMPLETED."""
    deadline = time.monotonic() + timeout_s
    while True:
        tasks = _api(state, "/task_runs/filter", {"flow_runs": {"id": {"any_": flow_run_ids}}})
        counts = {n: sum(t["name"].startswith(n + "-") and t["state_type"] == "COMPLETED" for t in tasks)
                  for n in names}
        if all(c >= expect for c in counts.values()) or time.monotonic() > deadline:
            return counts
        time.sleep(1)


class _ReportPage(HTMLParser):
    """The nightly report's HTML: {checkpoint: {cell class: text}}, the base paragraph and every link."""

    def __init__(self, text: str):
        super().__init__()
        self.cells, self.links, self.base, self._cls, self._row = {}, [], "", None, None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self._row = a["data-checkpoint"] if tag == "tr" and "data-checkpoint" in a else self._row
        self._cls = a.get("class") if tag in ("td", "p") else self._cls
        if tag == "a":
            self.links.append(a["href"])

    def handle_data(self, data):
        if self._cls == "base":
            self.base += data
        elif self._row and self._cls:
            self.cells.setdefault(self._row, {}).setdefault(self._cls, "")
            self.cells[self._row][self._cls] += data

    def handle_endtag(self, tag):
        self._cls = None if tag in ("td", "p") else self._cls


def _points(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"[-+]?\d+\.\d", text)]


def _check_nightly_report(state, store, runs) -> None:
    """The HTML report of the run that wrote last lists the four checkpoints in export order with accuracy, n and
    interval, pass@k, paired deltas to the previous checkpoint and to the base, and links that lead somewhere."""
    reports = sorted(k for k in store.list("nightly-eval/reports") if k.endswith(".html"))
    assert len(reports) in (1, 2) and all(store.exists(k[:-5] + ".md") for k in reports)
    pages = [(k, _ReportPage(store.get_text(k))) for k in reports]
    key, page = [(k, p) for k, p in pages if len(p.cells) == 4][-1]
    acc = {r["name"].removeprefix("eval "): r["value"] for r in wh(state, """select r.name, m.value from eval_metrics m
             join runs r using (run_id) where r.kind = 'eval' and m.metric = 'accuracy_greedy'""")}
    base_acc, base_lo, base_hi = _points(page.base)[:3]
    assert base_lo <= base_acc <= base_hi
    previous = None
    for name, row in page.cells.items():
        a, lo, hi = _points(row["accuracy"])
        assert a == pytest.approx(100 * acc[name], abs=0.05) and lo <= a <= hi and "(n = 200)" in row["accuracy"]
        assert re.fullmatch(r"@1 \d+\.\d, @2 \d+\.\d", row["passk"]), row["passk"]
        # Same 200 problems on both sides: the paired mean difference is the difference of the accuracies.
        d, dlo, dhi = _points(row["delta-base"])
        assert d == pytest.approx(a - base_acc, abs=0.11) and dlo <= d <= dhi and "(n = 200)" in row["delta-base"]
        if previous is None:
            assert row["delta-previous"] == "–"
        else:
            d, dlo, dhi = _points(row["delta-previous"])
            assert d == pytest.approx(a - previous, abs=0.11) and dlo <= d <= dhi
        previous = a
    # Every link works: relative ones reach files of the store, MLflow's name runs it holds, Prefect's the flow run.
    client, root = mlflow_client(state), Path(state["home"]) / "artifacts"
    kinds = {"store": 0, "mlflow": 0, "prefect": 0}
    for href in page.links:
        if href.startswith(state["mlflow_url"]):
            assert client.get_run(href.split("/runs/")[1].split("?")[0]).info.status == "FINISHED"
            assert urllib.request.urlopen(href, timeout=30).status == 200
            kinds["mlflow"] += 1
        elif href.startswith("http"):
            assert href.split("/")[-1] in {r["id"] for r in runs}, href
            kinds["prefect"] += 1
        else:
            assert (root / key).parent.joinpath(href).resolve().exists(), href
            kinds["store"] += 1
    assert kinds == {"store": 4 * 3 + 1, "mlflow": 4 * 2, "prefect": 1}, kinds
    # The flow run links the page; the evaluation runs start when their work began, not when they were recorded.
    arts = _api(state, "/artifacts/filter", {"artifacts": {"key": {"any_": ["nightly-eval-report-html"]}}})
    assert any(store.url(key) in a["data"] for a in arts), arts
    evals = wh(state, "select started_at, finished_at, duration_s from runs where kind = 'eval'")
    assert all(r["started_at"] < r["finished_at"] for r in evals), evals


def test_nightly_eval_evaluates_each_checkpoint_once(stack):
    from flows.nightly_eval import claim_folder, find_checkpoints, suite_version
    from flows.pipeline import resolve_config
    from rlvr_core.artifacts import claims
    from rlvr_core.artifacts.storage import LocalStore

    store = LocalStore(Path(stack["home"]) / "artifacts")
    suite, ckpts = suite_version(resolve_config("configs/demo.yaml", TINY_EVAL)), find_checkpoints(store)
    assert len(ckpts) == 4
    # A claim left by a run the server does not know (its worker and database row are gone): reclaimable.
    dead = str(uuid.uuid4())
    assert claims.claim(store, claim_folder(suite, ckpts[0]), dead, lambda c: False)
    # Two runs at once over the same four checkpoints: a deployment run on the worker and the flow called
    # directly (no deployment, so no deployment concurrency limit between them).
    first = _nightly_deployment_run(stack)
    code = ("import json, sys; from flows.nightly_eval import nightly_eval_flow; "
            "nightly_eval_flow(overrides=json.loads(sys.argv[1]))")
    direct = subprocess.run([os.sys.executable, "-c", code, json.dumps(TINY_EVAL)], cwd=str(ROOT), timeout=900,
                            env=stack_env(Path(stack["home"]), stack["api_url"]), capture_output=True, text=True)
    assert direct.returncode == 0, direct.stderr[-3000:]
    assert _wait_final(stack, [first])[0]["state_type"] == "COMPLETED"
    runs = [r for r in _api(stack, "/flow_runs/filter", {"flows": {"name": {"any_": ["nightly-eval"]}}})
            if r["state_type"] != "SCHEDULED"]  # the cron's future runs are already on the server
    assert len(runs) == 2 and all(r["state_type"] == "COMPLETED" for r in runs), [r["state_type"] for r in runs]
    # Each checkpoint evaluated and recorded once, by one of the two runs; the warehouse holds one row each.
    # (evaluate: the four checkpoints and, once for the suite, the base model the report compares them with)
    completed = _completed_tasks(stack, [r["id"] for r in runs], ("evaluate", "record-nightly-eval"), 4)
    assert completed == {"evaluate": 5, "record-nightly-eval": 4}, completed
    evals = wh(stack, "select name from runs where kind = 'eval' order by name")
    assert [e["name"] for e in evals] == [f"eval {p}" for p in ckpts]
    taken = claims.current(store, claim_folder(suite, ckpts[0]))
    assert taken["generation"] == 1 and taken["reclaimed_from"] == dead and taken["owner"] in {r["id"] for r in runs}
    # Each checkpoint's nightly greedy accuracy equals the pipeline's own evaluation of it (same suite settings).
    same = wh(stack, """select count(*) as n from eval_metrics a join eval_metrics b
                        on a.checkpoint = b.checkpoint and a.metric = b.metric
                        where a.eval_id = 'trained' and b.eval_id like 'nightly-%' and a.metric = 'accuracy_greedy'
                        and abs(a.value - b.value) < 1e-12""")
    assert same == [{"n": 4}]
    _check_nightly_report(stack, store, runs)

    # The deployment runs one at a time: of two runs created together one is cancelled by the concurrency
    # limit, the other finds nothing new and says so in one line, in seconds.
    t0 = time.monotonic()
    cancelled, completed = _wait_final(stack, [_nightly_deployment_run(stack), _nightly_deployment_run(stack)])
    wall = time.monotonic() - t0
    assert (cancelled["state_type"], completed["state_type"]) == ("CANCELLED", "COMPLETED")
    assert "concurrency limit" in cancelled["state"]["message"]
    run_s = (datetime.fromisoformat(completed["end_time"]) - datetime.fromisoformat(completed["start_time"]))
    run_s = run_s.total_seconds()
    assert run_s < 30 and wall < 30, (run_s, wall)
    # The flow run's logs reach the server in batches, after its state under load: wait for them, bounded.
    line, deadline = f"nothing new: 4 checkpoints already evaluated for suite {suite}", time.monotonic() + 30
    while True:
        logs = [m["message"] for m in
                _api(stack, "/logs/filter", {"logs": {"flow_run_id": {"any_": [completed["id"]]}}})]
        if line in logs or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert line in logs, logs
    assert wh(stack, "select name from runs where kind = 'eval' order by name") == evals
    print(f"nightly, nothing new: {run_s:.1f} s from Running to Completed, {wall:.1f} s from creation")


def _trainer_folder(home: Path, steps: int) -> Path | None:
    for key in (home / "cache" / "grpo").glob("*/cache_key.json"):
        if json.loads(key.read_text())["grpo"]["steps"] == steps:
            return key.parent
    return None


def test_lost_worker_trial_resumes_from_its_checkpoint(stack, tmp_path):
    home = Path(stack["home"])
    steps = 12
    sweep = tmp_path / "fault.yaml"
    demo = yaml.safe_load((ROOT / "configs" / "sweeps" / "demo_lr.yaml").read_text())
    sweep.write_text(yaml.safe_dump({"name": "fault-1", "base": str(ROOT / "configs" / "demo.yaml"),
                                     "set": {**demo["set"], "grpo.steps": steps, "grpo.checkpoint_every": 2,
                                             # small steps and evaluation: this trial checks resuming, not numbers
                                             "grpo.prompts_per_step": 2, "grpo.group_size": 4, "eval.max_problems": 40},
                                     "grid": {"grpo.lr": [2.0e-5]}}))
    env = stack_env(home, stack["api_url"])
    watcher = subprocess.Popen([str(Path(os.sys.executable).parent / "prefect"), "deployment", "run",
                                "ablation-sweep/demo-lr", "--param", f"sweep={sweep}", "--watch"],
                               env=env, cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # Wait for the trainer's first checkpoint, then lose the machine: worker, flow run and trainer at once.
        deadline = time.monotonic() + 420
        folder = None
        while time.monotonic() < deadline:
            folder = folder or _trainer_folder(home, steps)
            if folder is not None and (folder / "checkpoints" / "latest").is_file():
                break
            assert watcher.poll() is None, watcher.stdout.read()[-3000:]
            time.sleep(0.2)
        else:
            pytest.fail("the trainer wrote no checkpoint in time")
        os.killpg(stack["workers"][GPU_POOL], signal.SIGKILL)
        killed_at = (folder / "checkpoints" / "latest").read_text().strip()
        assert not (folder / ".done").exists()
        start_worker(stack, GPU_POOL, "local-gpu-2")
        out, _ = watcher.communicate(timeout=600)
    finally:
        if watcher.poll() is None:
            watcher.kill()
    assert watcher.returncode == 0 and "Completed" in out, out[-4000:]
    # The relaunched trial resumed: its summary says from which step, and it is the checkpoint we killed at or later.
    parent, children = sweep_runs(stack, "fault-1")
    assert len(children) == 1 and children[0].info.status == "FINISHED"
    run_id = children[0].info.run_id
    (row,) = wh(stack, "select run_prefix from ingest_log where run_id = ?", [run_id])
    summary = json.loads((home / "artifacts" / row["run_prefix"] / "summary.json").read_text())
    resumed = summary["train"]["resumed_from_step"]
    assert resumed >= int(killed_at.removeprefix("step")) >= 2 and summary["train"]["steps"] == steps
    # Every step exactly once in the warehouse, one run row, one trial.
    rows = wh(stack, "select step, count(*) as n from train_steps where run_id = ? and metric = 'reward_mean' "
                     "group by step order by step", [run_id])
    assert [r["step"] for r in rows] == list(range(1, steps + 1)) and all(r["n"] == 1 for r in rows)
    assert wh(stack, "select count(*) as n from runs where run_id = ?", [run_id]) == [{"n": 1}]
