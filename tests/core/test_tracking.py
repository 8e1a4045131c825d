"""MLflow conventions (rlvr_core.tracking) against a real MLflow sqlite store."""

from __future__ import annotations

import os

import pytest

from rlvr_core.tracking import (STANDARD_TAGS, Tracker, common_tags, config_params, metric_key, redact,
                                redact_url)


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
