"""Secrets never leak: the demo ran (conftest.stack_demo) with distinctive S3 credentials, an MLflow
tracking token and a password inside the tracking URI. None of those values may appear in what the run
recorded: MLflow params, tags and artifacts (read back over REST), the objects in the bucket
(manifests, run.json, checkpoints, MLflow's copies), every file under RLVR_HOME (Prefect's database,
the warehouse, caches, the stack's state and logs) or the demo's own output."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

pytestmark = [pytest.mark.slow, pytest.mark.s3]


def find(canaries: dict[str, str], data: bytes | str) -> list[str]:
    blob = data.encode() if isinstance(data, str) else data
    return [name for name, value in canaries.items() if value.encode() in blob]


def test_no_secret_in_mlflow_params_tags_or_artifacts(stack_demo, canaries):
    base, s = stack_demo["mlflow"], stack_demo["summary"]
    api = f"{base}/api/2.0/mlflow"
    runs = requests.post(f"{api}/runs/search", json={"experiment_ids": [s["mlflow_experiment_id"]],
                                                      "max_results": 100}, timeout=30).json()["runs"]
    assert len(runs) == 1 + len(s["mlflow_child_run_ids"])
    for run in runs:
        text = "\n".join(f"{x['key']}={x['value']}" for x in run["data"].get("params", []) + run["data"].get("tags", []))
        assert text and find(canaries, text) == [], run["info"]["run_name"]
    # Every artifact of every run, downloaded through the server.
    downloaded = 0

    def walk(run_id: str, path: str = "") -> None:
        nonlocal downloaded
        listing = requests.get(f"{api}/artifacts/list", params={"run_id": run_id, "path": path}, timeout=30).json()
        for f in listing.get("files", []):
            if f["is_dir"]:
                walk(run_id, f["path"])
                continue
            body = requests.get(f"{base}/api/2.0/mlflow-artifacts/artifacts/{s['mlflow_experiment_id']}/{run_id}"
                                f"/artifacts/{f['path']}", timeout=60).content
            assert find(canaries, body) == [], f["path"]
            downloaded += 1

    for run in runs:
        walk(run["info"]["run_id"])
    assert downloaded >= 10  # the run folder really was searched, not an empty listing


def test_no_secret_in_the_bucket(stack_demo, bucket, canaries):
    searched = []
    for page in bucket.get_paginator("list_objects_v2").paginate(Bucket="rlvr"):
        for obj in page.get("Contents", []):
            body = bucket.get_object(Bucket="rlvr", Key=obj["Key"])["Body"].read()
            assert find(canaries, body) == [], obj["Key"]
            searched.append(obj["Key"])
    run = stack_demo["summary"]["mlflow_run_id"]
    # The files most likely to capture an environment or a URI were among them.
    for key in ("manifest.json", "run.json", "summary.json", "config.yaml", "index.html",
                "checkpoints/final/export_manifest.json"):
        assert f"artifacts/team-stack/demo-{run[:8]}/{key}" in searched, key
    assert any(k.startswith("mlflow/") and k.endswith("/artifacts/manifest.json") for k in searched)


def test_recorded_uris_are_redacted_not_dropped(stack_demo, bucket):
    """The tracking URI is recorded (summary, index page link) with its password replaced, so the test
    above searched files that would have held it."""
    s = stack_demo["summary"]
    assert s["mlflow_tracking_uri"] == stack_demo["mlflow"].replace("http://", "http://rlvr:***@")
    body = bucket.get_object(Bucket="rlvr", Key=f"artifacts/team-stack/demo-{s['mlflow_run_id'][:8]}/summary.json")["Body"].read()
    assert b"rlvr:***@127.0.0.1" in body


def test_no_secret_in_local_state_or_output(stack_demo, canaries):
    assert find(canaries, stack_demo["stdout"] + stack_demo["stderr"]) == []
    home: Path = stack_demo["home"]
    files = [p for p in home.rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert {"state.json", "mlflow.log", "s3.log", "warehouse.duckdb"} <= names  # the stack's and the run's traces
    assert any(p.suffix == ".db" and "prefect" in str(p) for p in files)  # Prefect's flow-run records
    for p in files:
        assert find(canaries, p.read_bytes()) == [], str(p)
