"""MLflow conventions (rlvr_core.records.tracking) against a real MLflow sqlite store."""

from __future__ import annotations

import os
import time

import pytest

from rlvr_core.records.redact import is_secret_key, redact, redact_url
from rlvr_core.records.tracking import (EXPERIMENT_KIND_TAG, PRIMARY_METRIC_TAG, RUNS_VIEW_ID, STANDARD_TAGS,
                                        VIEW_TAG_PREFIX, StepMetricsSink, Tracker, common_tags, config_params,
                                        metric_key, saved_view)
from tests.mlflow_server import table_roots


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """One sqlite store for the module (creating one runs MLflow's migrations: seconds each)."""
    with pytest.MonkeyPatch.context() as mp:
        home = tmp_path_factory.mktemp("tracking-home")
        mp.setenv("RLVR_HOME", str(home))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        yield home


@pytest.fixture
def tracker(home, request):
    """A fresh experiment per test in the module's store."""
    return Tracker(f"conventions-{request.node.name}", common=common_tags(config_hash="c0ffee", git_sha="abc123"))


def test_metric_key_names_and_errors():
    assert metric_key("eval", "gsm8k", "pass@1") == "eval/gsm8k/pass_at_1"
    assert metric_key("train/reward_mean") == "train/reward_mean"
    assert metric_key("health/G-kl-explosion") == "health/G-kl-explosion"
    with pytest.raises(ValueError, match="needs a namespace"):
        metric_key("reward_mean")
    with pytest.raises(ValueError, match="unknown namespace 'trian'"):
        metric_key("trian/reward_mean")
    with pytest.raises(ValueError, match="segment ''"):
        metric_key("train//x")
    with pytest.raises(ValueError, match="segment 'a\\*b'"):
        metric_key("eval/a*b/acc")


def test_redaction_of_urls_and_secret_keys():
    assert redact_url("http://u:pw@host:5000/x") == "http://u:***@host:5000/x"
    assert redact_url("https://tok@host") == "https://***@host"
    assert redact_url("s3://bucket/prefix") == "s3://bucket/prefix" and redact_url("not a url") == "not a url"
    cfg = {"tracking": {"tracking_uri": "http://me:hunter2@mlflow:5000", "experiment": "e"},
           "storage": {"api_token": "t0k", "artifact_uri": None}, "grpo": {"lr": 1e-5, "steps": [1, 2]}}
    params = config_params(cfg)
    assert params == {"tracking.tracking_uri": "http://me:***@mlflow:5000", "tracking.experiment": "e",
                      "storage.api_token": "***", "storage.artifact_uri": None, "grpo.lr": 1e-5, "grpo.steps": [1, 2]}
    assert config_params(cfg, "grpo") == {"grpo.lr": 1e-5, "grpo.steps": [1, 2]}
    assert "hunter2" not in repr(redact(cfg)) and cfg["tracking"]["tracking_uri"].endswith("hunter2@mlflow:5000")


def test_parent_with_child_runs_and_common_tags(tracker):
    parent = tracker.start_run("pipeline", {"kind": "pipeline"})
    with tracker.child_run(parent, "data", params={"data.n": 3}) as data_run:
        tracker.add_common_tags(dataset_hash="d5")  # known only now: must reach the parent too
        tracker.log_metrics(data_run, {"data/n_train": 3})
    with pytest.raises(RuntimeError, match="boom"):
        with tracker.child_run(parent, "train") as train_run:
            raise RuntimeError("boom")
    tracker.end_run(parent)
    c = tracker.client
    runs = {r.info.run_id: r for r in c.search_runs([tracker.experiment_id])}
    assert set(runs) == {parent, data_run, train_run}
    assert runs[data_run].info.status == "FINISHED" and runs[train_run].info.status == "FAILED"
    for rid in (data_run, train_run):
        assert runs[rid].data.tags["mlflow.parentRunId"] == parent and runs[rid].data.tags["kind"] == "stage"
    assert runs[train_run].data.tags["stage"] == "train"
    expected = {"sweep_id": "", "trial_id": "", "config_hash": "c0ffee", "git_sha": "abc123",
                "prefect_flow_run_id": "", "dataset_hash": "d5"}
    for r in runs.values():
        assert {k: r.data.tags.get(k) for k in STANDARD_TAGS} == expected
    assert runs[data_run].data.params == {"data.n": "3"}
    assert runs[data_run].data.metrics["data/n_train"] == 3 and "time/data_s" in runs[data_run].data.metrics


def test_log_metrics_validates_and_converts_names(tracker):
    run = tracker.start_run("r", {})
    tracker.log_metrics(run, {"eval/gsm8k/pass@4": 0.5, "passk/mean": float("nan"), "train/x": None})
    assert tracker.client.get_run(run).data.metrics == {"eval/gsm8k/pass_at_4": 0.5}
    with pytest.raises(ValueError, match="unknown namespace 'accuracy'"):
        tracker.log_metrics(run, {"accuracy/x": 1.0})


def test_params_and_tags_are_redacted(tracker):
    run = tracker.start_run("r", {})
    tracker.log_params(run, {"tracking.tracking_uri": "http://u:s3cr3t@h:1", "x.password": "s3cr3t"})
    tracker.set_tags(run, {"endpoint": "http://u:s3cr3t@h:1", "api_token": "s3cr3t"})
    data = tracker.client.get_run(run).data
    assert "s3cr3t" not in repr(data.params) + repr(data.tags)
    assert data.params["tracking.tracking_uri"] == "http://u:***@h:1" and data.tags["api_token"] == "***"


def test_system_metrics_reach_a_client_run(tracker, monkeypatch):
    run = tracker.start_run("r", {})
    import time

    with tracker.system_metrics(run, sampling_interval=0.3):
        time.sleep(1.5)
    names = set(tracker.client.get_run(run).data.metrics)
    assert {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"} <= names
    monkeypatch.setenv("RLVR_SYSTEM_METRICS", "0")
    quiet = tracker.start_run("q", {})
    with tracker.system_metrics(quiet, sampling_interval=0.3):
        time.sleep(1.0)
    assert not tracker.client.get_run(quiet).data.metrics


def test_a_tracker_leaves_the_process_environment_alone(rlvr_home, monkeypatch):
    # mlflow.set_tracking_uri exports MLFLOW_TRACKING_URI; left there, every process started afterwards
    # (a Prefect worker of another stack, a stage process) would log to this tracker's store.
    import mlflow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    t = Tracker("env-a", tracking_uri=f"sqlite:///{rlvr_home / 'a.db'}")
    assert "MLFLOW_TRACKING_URI" not in os.environ
    assert mlflow.get_tracking_uri() == t.tracking_uri  # the in-process default still points at it
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///elsewhere.db")
    Tracker("env-b", tracking_uri=f"sqlite:///{rlvr_home / 'b.db'}")
    assert os.environ["MLFLOW_TRACKING_URI"] == "sqlite:///elsewhere.db"


def test_step_rows_are_logged_at_their_steps_in_few_batches(tracker):
    run = tracker.start_run("steps", {})
    rows = [{"step": s, "reward_mean": s / 10, "pass@1": 0.5, "health/G-entropy": int(s == 3),
             "note": "text", "flag": True, "kl_ref_mean": float("nan") if s == 2 else 0.1 * s}
            for s in range(1, 401)]
    calls = []
    real = tracker.client.log_batch
    tracker.client.log_batch = lambda run_id, metrics: (calls.append(len(metrics)), real(run_id, metrics=metrics))
    try:
        n = tracker.log_step_rows(run, rows)
    finally:
        tracker.client.log_batch = real
    # 400 steps x 4 numeric columns (text and bool skipped), less the one NaN
    assert n == 400 * 4 - 1 and calls == [1000] * 1 + [599]
    hist = {m.step: m.value for m in tracker.client.get_metric_history(run, "train/reward_mean")}
    assert hist == {s: s / 10 for s in range(1, 401)}
    # `@` is converted; guard columns keep their own namespace; NaN is skipped, not logged
    assert len(tracker.client.get_metric_history(run, "train/pass_at_1")) == 400
    assert {m.step: m.value for m in tracker.client.get_metric_history(run, "health/G-entropy")}[3] == 1
    assert 2 not in {m.step for m in tracker.client.get_metric_history(run, "train/kl_ref_mean")}
    assert not tracker.client.get_metric_history(run, "train/note")


# ------------------------------------------------------------------ redaction by names that are secrets
SECRET_NAMES = ["password", "db_password", "passwd", "secret", "client_secret", "aws_secret_access_key",
                "api_key", "apikey", "openai_api_key", "access_key", "aws_access_key_id", "private_key",
                "credential", "google_credentials", "auth", "basic_auth", "authorization", "token", "hf_token",
                "access_token", "api_token", "auth_token", "MLFLOW_TRACKING_TOKEN", "HF_TOKEN", "hfToken",
                "storage.api_token", "tracking.password"]
PLAIN_NAMES = ["max_new_tokens", "eval.max_new_tokens", "sampling.max_new_tokens", "max_tokens", "tokens_per_s",
               "n_tokens", "tokenizer", "tokenizer_hash", "token_kl", "pad_token", "eos_token", "author",
               "max_tokens_per_step", "lr", "tracking_uri", "experiment",
               "loss_agg", "kl_ref_mean"]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_names_are_redacted(name):
    assert is_secret_key(name), name
    assert redact({name: "hunter2"}) == {name: "***"}


@pytest.mark.parametrize("name", PLAIN_NAMES)
def test_token_counts_and_tokenizers_are_not_secrets(name):
    assert not is_secret_key(name), name
    assert redact({name: 48}) == {name: 48}


def test_max_new_tokens_params_keep_their_values(tracker):
    run = tracker.start_run("r", {})
    cfg = {"eval": {"max_new_tokens": 48}, "sampling": {"max_new_tokens": 64},
           "storage": {"hf_token": "hunter2"}, "tracking": {"tracking_uri": "http://u:hunter2@h:1"}}
    tracker.log_params(run, config_params(cfg))
    params = tracker.client.get_run(run).data.params
    assert params["eval.max_new_tokens"] == "48" and params["sampling.max_new_tokens"] == "64"
    assert params["storage.hf_token"] == "***" and params["tracking.tracking_uri"] == "http://u:***@h:1"
    assert "hunter2" not in repr(params)


# ------------------------------------------------------------------ MLflow 3 opens the runs view
def test_experiments_are_tagged_machine_learning_and_links_open_the_runs(home):
    created = Tracker("kind-created")
    assert created.client.get_experiment(created.experiment_id).tags[EXPERIMENT_KIND_TAG] == "custom_model_development"
    # An experiment made elsewhere (an older rlvr, the UI) gets the tag when a Tracker uses it ...
    other = created.client.create_experiment("kind-existing")
    created.client.set_experiment_tag(other, EXPERIMENT_KIND_TAG, "no_inferred_type")  # what MLflow may infer
    Tracker("kind-existing")
    assert created.client.get_experiment(other).tags[EXPERIMENT_KIND_TAG] == "custom_model_development"
    # ... but a kind someone chose stays.
    chosen = created.client.create_experiment("kind-chosen", tags={EXPERIMENT_KIND_TAG: "genai_development"})
    Tracker("kind-chosen")
    assert created.client.get_experiment(chosen).tags[EXPERIMENT_KIND_TAG] == "genai_development"
    # MLflow 3.17's UI picks the view from the link's workflowType (the tag is what older 3.x UIs read).
    served = Tracker("kind-created", tracking_uri=created.tracking_uri)
    served.tracking_uri = "http://rlvr:pw@127.0.0.1:5000"
    assert served.run_url("abc") == (f"http://127.0.0.1:5000#/experiments/{created.experiment_id}/runs/abc"
                                     "?workflowType=machine_learning")
    assert served.experiment_url() == (f"http://127.0.0.1:5000#/experiments/{created.experiment_id}"
                                       "?workflowType=machine_learning")
    # The compare view of a sweep's trials: MLflow's own route (JSON lists, URL-encoded), sorted run ids.
    e = created.experiment_id
    assert served.compare_url(["b2", "a1"]) == (
        f'http://127.0.0.1:5000/#/compare-runs?runs=%5B%22a1%22%2C%20%22b2%22%5D&experiments=%5B%22{e}%22%5D'
        "&workflowType=machine_learning")


# ------------------------------------------------------------------ per-step metrics while training runs
def _row(step: int, value: float) -> dict:
    return {"step": step, "loss": value, "reward_mean": value / 2, "health/G-entropy": 0, "note": "x"}


def _history(client, run, key="train/loss") -> list:
    return sorted(client.get_metric_history(run, key), key=lambda m: (m.step, m.timestamp))


def _wait_for_step(client, run, step: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while step not in {m.step for m in client.get_metric_history(run, "train/loss")}:
        assert time.monotonic() < deadline, f"step {step} not in MLflow after {timeout_s}s"
        time.sleep(0.05)


def test_step_sink_sends_each_step_during_training_with_its_own_time(tracker):
    run = tracker.start_run("live", {})
    handed = {}
    with StepMetricsSink(run, tracker.tracking_uri, every_steps=2, every_s=0.2) as sink:
        for step in range(1, 7):
            t0 = time.perf_counter()
            handed[step] = int(time.time() * 1000)
            sink(_row(step, float(step)))
            assert time.perf_counter() - t0 < 0.05  # the trainer never waits for MLflow
            _wait_for_step(tracker.client, run, step)  # visible while "training" still runs
            time.sleep(0.03)
    hist = _history(tracker.client, run)
    assert [m.step for m in hist] == [1, 2, 3, 4, 5, 6]  # each step once
    stamps = [m.timestamp for m in hist]
    assert stamps == sorted(stamps) and len(set(stamps)) == 6  # their own times, not one shared stamp
    assert all(abs(m.timestamp - handed[m.step]) < 50 for m in hist)
    assert [m.step for m in _history(tracker.client, run, "health/G-entropy")] == [1, 2, 3, 4, 5, 6]
    assert sink.sent == 6 * 3 and tracker.log_step_rows(run, [_row(s, float(s)) for s in range(1, 7)]) == 0


def test_step_sink_after_resume_logs_no_step_twice(tracker):
    run = tracker.start_run("resumed", {})
    with StepMetricsSink(run, tracker.tracking_uri, every_s=0.1) as sink:  # killed after step 4 ...
        for step in range(1, 5):
            sink(_row(step, float(step)))
    with StepMetricsSink(run, tracker.tracking_uri, every_s=0.1) as sink:  # ... resumed from its step-2 checkpoint
        for step in range(3, 8):
            sink(_row(step, 100.0 + step))
    hist = _history(tracker.client, run)
    assert [m.step for m in hist] == list(range(1, 8))
    assert {m.step: m.value for m in hist}[3] == 3.0 and {m.step: m.value for m in hist}[7] == 107.0
    # The record afterwards (steps.parquet) only fills what is missing: here nothing.
    assert tracker.log_step_rows(run, [_row(s, 100.0 + s) for s in range(1, 8)]) == 0
    assert [m.step for m in _history(tracker.client, run)] == list(range(1, 8))


def test_log_step_rows_backfills_only_missing_steps(tracker):
    run = tracker.start_run("backfill", {})
    tracker.log_step_rows(run, [_row(s, float(s)) for s in (1, 2)])
    assert tracker.log_step_rows(run, [_row(s, float(s)) for s in (1, 2, 3)]) == 3  # step 3's three values
    assert [m.step for m in _history(tracker.client, run)] == [1, 2, 3]


# ------------------------------------------------------------------ saved views: no stage runs, a sweep's pivot first
def _view_state(tracker: Tracker, view_id: str) -> dict:
    """A saved view as MLflow's UI reads it: the envelope in the experiment tag, the state a JSON string inside."""
    import json

    envelope = json.loads(tracker.client.get_experiment(tracker.experiment_id).tags[VIEW_TAG_PREFIX + view_id])
    assert isinstance(envelope["name"], str) and isinstance(envelope["createdAt"], int)
    return json.loads(envelope["state"])


def test_a_relaunched_run_goes_on_in_its_stage_runs(tracker):
    """A trial relaunched after its worker was lost (the run found again by `open_run`) finds each stage's run again:
    the finished ones and the one the lost worker left RUNNING; a stage it had not reached gets a new run."""
    trial = tracker.start_run("t00", {"kind": "trial", "sweep_id": "s1", "trial_id": "t00"})
    with tracker.child_run(trial, "data", params={"data.n": 3}) as data_run:
        tracker.log_metrics(data_run, {"data/n_train": 3})
    lost = tracker.start_run("train", {"kind": "stage", "stage": "train"}, parent_run_id=trial)  # killed mid-stage
    again = Tracker(tracker.experiment)  # the relaunch: another process, its own Tracker
    again.add_common_tags(dataset_hash="d6")
    with again.child_run(trial, "data", params={"data.n": 3, "data.m": 1}) as data_again:
        pass
    with again.child_run(trial, "train", params={"grpo.steps": 2}) as train_again:
        pass
    with again.child_run(trial, "export") as export_run:
        pass
    assert (data_again, train_again) == (data_run, lost) and export_run not in (data_run, lost)
    children = tracker.client.search_runs([tracker.experiment_id], f"tags.mlflow.parentRunId = '{trial}'")
    assert sorted(c.info.run_name for c in children) == ["data", "export", "train"]
    assert all(c.info.status == "FINISHED" for c in children)
    runs = {c.info.run_id: c for c in children}
    assert runs[data_run].data.params == {"data.n": "3", "data.m": "1"}  # kept, and the new one added
    assert runs[lost].data.tags["dataset_hash"] == "d6" and runs[lost].data.params == {"grpo.steps": "2"}


def test_the_runs_view_lists_every_run_but_the_stage_runs(tracker):
    demo = tracker.start_run("demo", {"kind": "demo"})
    with tracker.child_run(demo, "data"), tracker.child_run(demo, "train"):
        pass
    sweep = tracker.start_run("sweep", {"kind": "sweep"})
    trial = tracker.start_run("t01", {"kind": "trial"}, parent_run_id=sweep)
    with tracker.child_run(trial, "train"):
        pass
    state = _view_state(tracker, RUNS_VIEW_ID)
    listed = tracker.client.search_runs([tracker.experiment_id], state["searchFilter"])
    assert {r.info.run_id for r in listed} == {demo, sweep, trial}  # 3 of the 6 runs: no stage run
    everything = tracker.client.search_runs([tracker.experiment_id], "")
    assert len(everything) == 6
    assert sorted(table_roots(everything)) == ["demo", "sweep"]  # MLflow's own table: the rest folded under them
    charts = [c["metricKey"] for c in state["compareRunCharts"]]
    assert charts[:2] == ["train/reward_mean", "train/eval/greedy_pass_at_1"]
    assert {c["metricSectionId"] for c in state["compareRunCharts"]} <= {s["uuid"] for s in state["compareRunSections"]}
    # A view someone edited in the UI is theirs: a later Tracker does not overwrite it.
    tracker.client.set_experiment_tag(tracker.experiment_id, VIEW_TAG_PREFIX + RUNS_VIEW_ID,
                                      saved_view("mine", search_filter="", sections={}))
    Tracker(tracker.experiment)
    assert _view_state(tracker, RUNS_VIEW_ID)["searchFilter"] == ""
    served = Tracker(tracker.experiment)
    served.tracking_uri = "http://u:pw@127.0.0.1:5000"
    assert served.view_url() == (f"http://127.0.0.1:5000/#/experiments/{tracker.experiment_id}/runs"
                                 "?workflowType=machine_learning&viewStateShareKey=rlvr-runs&compareRunsMode=CHART")


def test_a_sweep_view_lists_its_trials_with_the_pivot_metric_first(tracker):
    from flows.ablation_sweep import _save_sweep_view, sweep_view_id
    from rlvr_core.pipeline.sweeps import load_sweep
    from rlvr_core.pipeline.child.run import ROOT

    sw = load_sweep(ROOT / "configs" / "sweeps" / "demo_lr.yaml")  # 2 cells x 3 seeds, metric accuracy_greedy
    parent = tracker.start_run("sweep", {"kind": "sweep", "sweep_id": "s1"})
    trials = [tracker.start_run(f"t{i}", {"kind": "trial", "sweep_id": "s1"}, parent_run_id=parent) for i in range(2)]
    with tracker.child_run(trials[0], "train", tags={"sweep_id": "s1"}):
        pass
    tracker.start_run("other sweep's trial", {"kind": "trial", "sweep_id": "s2"})
    _save_sweep_view(sw, "s1", tracker)
    state = _view_state(tracker, sweep_view_id("s1"))
    listed = tracker.client.search_runs([tracker.experiment_id], state["searchFilter"])
    assert sorted(r.info.run_id for r in listed) == sorted(trials)
    # The pivot metric (the trained checkpoint's greedy accuracy on the held-out split, as flows/pipeline.py logs it
    # on every trial run) is the first chart, a bar per trial, for all 6 trials, and the experiment's primary metric.
    first = state["compareRunCharts"][0]
    assert (first["type"], first["metricKey"]) == ("BAR", "eval/synthetic/trained/accuracy_greedy")
    assert first["runsCountToCompare"] == len(sw.trials) == 6 and state["compareRunSections"][0]["uuid"] == first["metricSectionId"]
    assert state["isAccordionReordered"] is True  # the UI keeps this order instead of sorting sections by name
    # Grouped by the swept params (params on every trial run), so a bar is a cell's mean over its seeds.
    assert state["groupBy"] == {"aggregateFunction": "average", "groupByKeys": [
        {"mode": "param", "groupByData": "grpo.lr"}]}
    exp_tags = tracker.client.get_experiment(tracker.experiment_id).tags
    assert exp_tags[PRIMARY_METRIC_TAG] == "eval/synthetic/trained/accuracy_greedy"


def test_live_curves_reach_the_stage_run_and_the_run_above_it(tracker):
    """The trainer's `on_step` with two run ids (the train stage run and its pipeline/trial run) sends every step
    to both, at its step."""
    from rlvr_core.experiment.config import parse_config
    from rlvr_core.pipeline.train_stage import _live_metrics

    parent = tracker.start_run("trial", {"kind": "trial"})
    with tracker.child_run(parent, "train") as child:
        cfg = parse_config({"tracking": {"experiment": tracker.experiment, "tracking_uri": tracker.tracking_uri}})
        with _live_metrics(cfg, [child, parent]) as on_step:
            for step in (1, 2, 3):
                on_step(_row(step, float(step)))
    for run_id in (child, parent):
        history = tracker.client.get_metric_history(run_id, "train/reward_mean")
        assert sorted((m.step, m.value) for m in history) == [(1, 0.5), (2, 1.0), (3, 1.5)], run_id
