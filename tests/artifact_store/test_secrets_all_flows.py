"""No flow records a secret: the pipeline flow (the one behind `prefect deployment run`), an ablation sweep
and the nightly evaluation run through Prefect (`prefect_test_harness`) against a real MLflow server whose
tracking URI carries a password, with S3 (moto_server) credentials that are canaries too. Then every
object in the artifact store, every MLflow param, tag and artifact (read back over REST), every warehouse
table and everything the flows logged is searched for the secrets: zero hits. (tests/integration/
test_secrets.py does the same for `rlvr demo` on the local stack.)"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import requests
import yaml

from tests.mlflow_server import start_mlflow

pytestmark = [pytest.mark.slow, pytest.mark.s3]

TINY = {"data.synthetic.n_train": 200, "data.synthetic.n_test": 12, "model.warm_start.steps": 20,
        "passk.max_prompts": 8, "passk.n_samples": 2, "passk.ks": [1, 2], "eval.n_samples": 2,
        "eval.max_problems": 8, "tracking.experiment": "secrets"}
TRAIN = {"grpo.enabled": True, "grpo.steps": 2, "grpo.warmup_steps": 0, "grpo.prompts_per_step": 2,
         "grpo.group_size": 2, "grpo.checkpoint_every": 2}


def _hits(canaries: dict[str, str], data: bytes | str) -> list[str]:
    blob = data.encode() if isinstance(data, str) else data
    return [name for name, value in canaries.items() if value.encode() in blob]


def test_pipeline_sweep_and_nightly_record_no_secret(prefect_api, rlvr_home, s3_env, monkeypatch, tmp_path, capfd, caplog):
    from flows.ablation_sweep import ablation_sweep_flow
    from flows.local_stack import stop_pid
    from flows.nightly_eval import nightly_eval_flow
    from flows.pipeline import pipeline_flow
    from rlvr_core.core import settings
    from rlvr_core.records import warehouse
    from tasks.stage_process import ROOT

    canaries = {"tracking password": f"trk-{uuid.uuid4().hex}", "S3 secret key": f"s3s-{uuid.uuid4().hex}"}
    endpoint, bucket = s3_env
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", canaries["S3 secret key"])  # moto accepts any
    monkeypatch.setenv("RLVR_ARTIFACT_URI", f"s3://{bucket}/artifacts")
    monkeypatch.setenv("RLVR_S3_ENDPOINT_URL", endpoint)
    mlflow = start_mlflow(tmp_path / "mlflow-home")
    # MLflow sends the user and password as basic auth; the test server ignores them. They must never be recorded.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow["url"].replace("http://", f"http://rlvr:{canaries['tracking password']}@"))
    settings.configure_environment()
    sweep = tmp_path / "secrets.yaml"
    sweep.write_text(yaml.safe_dump({"name": "secrets-1", "base": str(ROOT / "configs" / "demo.yaml"),
                                     "set": {**TINY, **TRAIN}, "grid": {"grpo.lr": [1.0e-5]}, "seeds": [0],
                                     "metric": "accuracy_greedy"}))
    try:
        swept = ablation_sweep_flow(str(sweep), max_parallel=1, deployment=None)
        single = pipeline_flow(str(ROOT / "configs" / "demo.yaml"), {**TINY, "grpo.enabled": False})  # evaluation only
        nightly = nightly_eval_flow(str(ROOT / "configs" / "demo.yaml"), TINY)
        assert nightly["evaluated"], nightly  # the sweep's checkpoint was found and evaluated
        assert single["mlflow_tracking_uri"] == mlflow["url"].replace("http://", "http://rlvr:***@")

        # 1. Every object in the artifact store.
        import boto3

        s3 = boto3.client("s3", endpoint_url=endpoint)
        keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
                for o in page.get("Contents", [])]
        for key in keys:
            assert _hits(canaries, s3.get_object(Bucket=bucket, Key=key)["Body"].read()) == [], key
        for name in ("config.yaml", "params.json", "manifest.json", "summary.json", "run.json", "report.md"):
            assert sum(k.endswith("/" + name) for k in keys) >= 3, name  # pipeline, trial and nightly runs

        # 2. Every MLflow param, tag and artifact, through the server.
        api = f"{mlflow['url']}/api/2.0/mlflow"
        exps = requests.post(f"{api}/experiments/search", json={"max_results": 100}, timeout=30).json()["experiments"]
        runs = [r for e in exps for r in requests.post(f"{api}/runs/search", json={
            "experiment_ids": [e["experiment_id"]], "max_results": 500}, timeout=30).json().get("runs", [])]
        assert len(runs) >= 4  # sweep parent, trial, pipeline run, nightly evaluation
        artifacts = 0
        for run in runs:
            data = run["data"]
            text = "\n".join(f"{x['key']}={x['value']}" for x in data.get("params", []) + data.get("tags", []))
            assert _hits(canaries, text) == [], run["info"]["run_name"]
            todo = [""]
            while todo:
                listing = requests.get(f"{api}/artifacts/list", params={"run_id": run["info"]["run_id"],
                                                                        "path": todo.pop()}, timeout=30).json()
                for f in listing.get("files", []):
                    if f["is_dir"]:
                        todo.append(f["path"])
                        continue
                    body = requests.get(f"{mlflow['url']}/get-artifact", params={
                        "run_id": run["info"]["run_id"], "path": f["path"]}, timeout=60).content
                    assert _hits(canaries, body) == [], f["path"]
                    artifacts += 1
        assert artifacts >= 10

        # 3. Every warehouse table, every value.
        tables = [r["table_name"] for r in warehouse.query_records(
            "select table_name from information_schema.tables where table_schema = 'main'")]
        assert {"runs", "run_params", "eval_metrics"} <= set(tables)
        for table in tables:
            rows = warehouse.query_records(f'select * from "{table}"')
            assert _hits(canaries, repr(rows)) == [], table

        # 4. What the flows logged (Prefect's console handler and Python logging) and printed.
        out, err = capfd.readouterr()
        assert _hits(canaries, out + err + caplog.text) == []
        assert "secrets" in out + err + caplog.text  # the capture did see the flows' output
    finally:
        stop_pid(mlflow["pid"])


def test_the_recorder_redacts_whatever_a_caller_passes(rlvr_home, tmp_path):
    """`record_run` is every flow's one recorder (run folder, MLflow, warehouse): it redacts, so no caller can
    forget. A caller passes secrets everywhere; the artifact store, MLflow (sqlite) and the warehouse hold none,
    and a second call (a retried task) leaves exactly the same warehouse rows."""
    import duckdb
    import pyarrow as pa

    from rlvr_core.core import settings
    from rlvr_core.records.runrecord import record_run
    from rlvr_core.artifacts.storage import open_store
    from rlvr_core.records.tracking import Tracker

    uri, key = "http://rlvr:hunter2@mlflow.example:5000", "AKIA-secret-value"
    store = open_store(str(tmp_path / "store"))
    tracker = Tracker("recorder", f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = tracker.start_run("r", {})
    row = {"run_id": run_id, "experiment": "recorder", "name": "r", "kind": "pipeline", "status": "FINISHED",
           "artifact_uri": uri, "mlflow_run_id": run_id}
    kwargs = dict(run=row, params={"tracking.tracking_uri": uri, "storage.api_key": key},
                  manifest={"resolved_config": {"tracking": {"tracking_uri": uri}}},
                  config={"tracking": {"tracking_uri": uri}, "aws_secret_access_key": key},
                  summary={"mlflow_tracking_uri": uri}, metrics={"eval/x/accuracy_greedy": 0.5},
                  tables={"evals/extra.parquet": pa.table({"note": [f"see {uri}"]})},
                  tags={"tracking": uri, "api_key": key}, texts={"report.md": f"MLflow at {uri}"})
    counts = record_run(store, "recorder/r", tracker, run_id, **kwargs)
    assert counts["runs"] == 1
    assert record_run(store, "recorder/r", tracker, run_id, **kwargs) == counts  # safe to repeat
    folder = tmp_path / "store" / "recorder" / "r"
    text = "".join(p.read_text() for p in folder.iterdir() if p.is_file())
    assert "http://rlvr:***@mlflow.example:5000" in text and "hunter2" not in text
    assert key not in text and (folder / "report.md").read_text() == "MLflow at http://rlvr:***@mlflow.example:5000"
    run = tracker.client.get_run(run_id).data
    assert "hunter2" not in repr(run.params) + repr(run.tags) and key not in repr(run.params) + repr(run.tags)
    with duckdb.connect(str(settings.warehouse_path()), read_only=True) as con:
        assert con.execute("select count(*) from runs where run_id = ?", [run_id]).fetchone()[0] == 1
        dump = repr(con.execute("select * from run_params").fetchall()) + repr(con.execute("select * from runs").fetchall())
    assert "hunter2" not in dump and key not in dump
