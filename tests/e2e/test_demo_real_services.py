"""The same demo flow against real services, by configuration only: a Prefect server
(`prefect_test_harness`, a real temporary SQLite-backed API) and S3 (moto_server over HTTP)."""

from __future__ import annotations

import json

import boto3
import pytest

pytestmark = pytest.mark.slow

TINY = {
    "data": {"synthetic": {"n_train": 200, "n_test": 20}},
    "model": {"warm_start": {"steps": 20}},
    "passk": {"max_prompts": 8, "n_samples": 2, "ks": [1, 2]},
    "eval": {"n_samples": 2},
    "tracking": {"experiment": "real-services"},
}


def test_demo_pipeline_on_prefect_server_and_s3(prefect_api, rlvr_home, s3_env, monkeypatch):
    from prefect.client.orchestration import get_client

    endpoint, bucket = s3_env
    monkeypatch.setenv("RLVR_ARTIFACT_URI", f"s3://{bucket}/team")
    monkeypatch.setenv("RLVR_S3_ENDPOINT_URL", endpoint)

    from flows.pipeline import pipeline_flow
    from rlvr_core.core import settings
    from rlvr_core.records import warehouse
    from rlvr_core.experiment.config import parse_config
    from rlvr_core.artifacts.storage import open_store

    settings.configure_environment()
    cfg = parse_config(TINY)
    summary = pipeline_flow(cfg.resolved(), kind="demo", eval_base=True, in_process=True, show_progress=False)
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(summary["prefect_flow_run_id"])
        assert run.state.is_completed()
        assert client.read_flow(run.flow_id).name == "pipeline"  # the demo is the pipeline flow

    run_id = summary["mlflow_run_id"]
    folder = f"demo-{run_id[:8]}"  # <experiment>/<run name>-<run id[:8]> (rlvr_core.artifacts.layout)
    assert summary["artifact_uri"] == f"s3://{bucket}/team/real-services/{folder}"
    # The run folder really is in the bucket, run.json included (written last).
    s3 = boto3.client("s3", endpoint_url=endpoint)
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=f"team/real-services/{folder}/")["Contents"]}
    assert {f"team/real-services/{folder}/{k}" for k in ("run.json", "manifest.json", "config.yaml",
                                                          "evals/samples.parquet")} <= keys
    manifest = json.loads(s3.get_object(Bucket=bucket, Key=f"team/real-services/{folder}/manifest.json")["Body"].read())
    assert manifest["prefect_flow_run_id"] == summary["prefect_flow_run_id"]
    # The run's index page sits at its root and links its files relatively.
    index = s3.get_object(Bucket=bucket, Key=f"team/real-services/{folder}/index.html")["Body"].read().decode()
    assert 'href="manifest.json"' in index and 'href="evals/samples.parquet"' in index
    # MLflow: the demo is a parent run with one finished child per stage, all carrying the same standard tags.
    from mlflow.tracking import MlflowClient

    from rlvr_core.records.tracking import STANDARD_TAGS

    client = MlflowClient(tracking_uri=settings.mlflow_tracking_uri())
    parent = client.get_run(run_id)
    children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{run_id}'")
    assert {c.info.run_name for c in children} == {"data", "base-model", "passk", "curriculum", "evaluate-base"}
    assert {c.info.run_name: c.info.run_id for c in children} == summary["mlflow_child_run_ids"]
    assert all(c.info.status == "FINISHED" for c in children)
    for r in (parent, *children):
        assert {k: r.data.tags.get(k) for k in STANDARD_TAGS} == {
            "sweep_id": "", "trial_id": "", "config_hash": summary["config_hash"], "git_sha": manifest["code"]["sha"] or "",
            "prefect_flow_run_id": summary["prefect_flow_run_id"], "dataset_hash": json.loads(
                s3.get_object(Bucket=bucket, Key=f"team/real-services/{folder}/run.json")["Body"].read())["dataset_hash"]}
    # Each stage's numbers live on its child; the headline numbers on the parent.
    (ev,) = [c for c in children if c.info.run_name == "evaluate-base"]
    assert ev.data.tags["stage"] == "evaluate" and ev.data.params["eval.verifier"] == "gsm8k"
    assert "passk.n_samples" not in ev.data.params  # a child carries only its own config sections
    assert ev.data.metrics["eval/synthetic/accuracy_greedy"] == parent.data.metrics["eval/synthetic/accuracy_greedy"] \
        == summary["base_pass_at_1"]
    (pk,) = [c for c in children if c.info.run_name == "passk"]
    assert pk.data.params["passk.n_samples"] == "2" and pk.data.metrics["passk/n_problems"] == 8
    # The warehouse was filled from S3, and a rebuild from the bucket gives the same rows.
    q = "select count(*) as n from eval_samples where run_id = ?"
    before = warehouse.query_records(q, [run_id])
    assert before == [{"n": 20 * (1 + 2)}]
    warehouse.rebuild(open_store())
    assert warehouse.query_records(q, [run_id]) == before
