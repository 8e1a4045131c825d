"""No flow leaks a secret: the pipeline flow (the one behind `prefect deployment run`), an ablation sweep and the
nightly evaluation run through Prefect (`prefect_test_harness`) against a real MLflow server and S3 (moto_server),
with canaries everywhere a secret can come from: the environment (a password inside MLFLOW_TRACKING_URI, the S3
secret key), a config file (the sweep's base: a tracking URI and an S3 endpoint with passwords) and overrides (the
pipeline's: the same fields, other passwords). Then every object in the artifact store, every MLflow param, tag
and artifact (read back over REST), every warehouse table, the Prefect parameters of every flow run, Prefect's
database, every file left under the test's folders (no stage request file among them) and everything the flows
logged are searched for the canaries: zero hits. (tests/integration/test_secrets.py does the same for `rlvr demo`
on the local stack.)"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
import requests
import yaml

from tests.mlflow_server import start_mlflow

pytestmark = [pytest.mark.slow, pytest.mark.s3]

# The checks are about where a secret could land, not about accuracy: the smallest sizes that run every stage
# (8-token generations, a 4-step warm start, 4 held-out problems).
TINY = {"data.synthetic.n_train": 16, "data.synthetic.n_test": 4, "model.warm_start.steps": 4,
        "passk.max_prompts": 8, "passk.n_samples": 2, "passk.ks": [1, 2], "eval.n_samples": 2,
        "eval.max_problems": 4, "sampling.max_new_tokens": 8, "eval.max_new_tokens": 8,
        "tracking.experiment": "secrets"}
TRAIN = {"grpo.enabled": True, "grpo.steps": 2, "grpo.warmup_steps": 0, "grpo.prompts_per_step": 2,
         "grpo.group_size": 2, "grpo.dynamic_sampling": False, "grpo.checkpoint_every": 2,
         "grpo.guards.health.no_signal.serious": False}  # 2 steps of a tiny base: no signal, by design


def _hits(canaries: dict[str, str], data: bytes | str) -> list[str]:
    blob = data.encode() if isinstance(data, str) else data
    return [name for name, value in canaries.items() if value.encode() in blob]


def _with_password(url: str, password: str) -> str:
    return url.replace("http://", f"http://rlvr:{password}@", 1)


def _files_with_hits(canaries: dict[str, str], roots: list[Path], skip: set[Path]) -> dict[str, list[str]]:
    """Every file under `roots` (but `skip`) that holds a canary, with the canaries it holds."""
    found = {}
    for root in roots:
        for f in (p for p in root.rglob("*") if p.is_file() and p not in skip):
            hits = _hits(canaries, f.read_bytes())
            if hits:
                found[str(f)] = hits
    return found


def _flow_runs_since(started) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterExpectedStartTime

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            expected_start_time=FlowRunFilterExpectedStartTime(after_=started)), limit=200)
        flows = {f.id: f.name for f in client.read_flows(limit=200)}
    return [(flows.get(r.flow_id), r) for r in runs]


def test_pipeline_sweep_and_nightly_record_no_secret(prefect_api, rlvr_home, s3_env, monkeypatch, tmp_path, capfd, caplog):
    from datetime import datetime, timedelta, timezone

    import prefect.settings

    from flows.ablation_sweep import ablation_sweep_flow
    from flows.local_stack import stop_pid
    from flows.nightly_eval import nightly_eval_flow
    from flows.pipeline import pipeline_flow
    from rlvr_core.core import settings
    from rlvr_core.experiment.secrets import is_sealed
    from rlvr_core.records import warehouse
    from rlvr_core.pipeline.child.run import ROOT
    from tasks.stage_process import tmp_root

    canaries = {name: f"{tag}-{uuid.uuid4().hex}" for name, tag in [
        ("env tracking password", "trk"), ("env S3 secret key", "s3s"), ("config tracking password", "ctp"),
        ("config S3 endpoint password", "csp"), ("override tracking password", "otp"),
        ("override S3 endpoint password", "osp")]}
    endpoint, bucket = s3_env
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", canaries["env S3 secret key"])  # moto accepts any
    monkeypatch.setenv("RLVR_ARTIFACT_URI", f"s3://{bucket}/artifacts")
    monkeypatch.setenv("RLVR_S3_ENDPOINT_URL", endpoint)
    mlflow = start_mlflow(tmp_path / "mlflow-home")
    # MLflow sends the user and password as basic auth and the S3 client ignores userinfo in its endpoint; the
    # test servers ignore both. They must never be recorded, stored by Prefect or left in a file.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", _with_password(mlflow["url"], canaries["env tracking password"]))
    settings.configure_environment()
    # The sweep's base: the demo config with passwords in its tracking URI and S3 endpoint (the nightly run reads
    # the environment's; the single pipeline run gets others as overrides).
    base = tmp_path / "secret-demo.yaml"
    demo = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    demo["tracking"]["tracking_uri"] = _with_password(mlflow["url"], canaries["config tracking password"])
    demo["storage"] = {"s3_endpoint_url": _with_password(endpoint, canaries["config S3 endpoint password"])}
    base.write_text(yaml.safe_dump(demo))
    sweep = tmp_path / "secrets.yaml"
    sweep.write_text(yaml.safe_dump({"name": "secrets-1", "base": str(base), "set": {**TINY, **TRAIN},
                                     "grid": {"grpo.lr": [1.0e-5]}, "seeds": [0], "metric": "accuracy_greedy"}))
    overrides = {**TINY, "grpo.enabled": False,  # evaluation only
                 "tracking.tracking_uri": _with_password(mlflow["url"], canaries["override tracking password"]),
                 "storage.s3_endpoint_url": _with_password(endpoint, canaries["override S3 endpoint password"])}
    started = datetime.now(timezone.utc) - timedelta(seconds=1)
    try:
        swept = ablation_sweep_flow(str(sweep), max_parallel=1, deployment=None)
        single = pipeline_flow(str(ROOT / "configs" / "demo.yaml"), overrides)
        nightly = nightly_eval_flow(str(ROOT / "configs" / "demo.yaml"), TINY)
        assert nightly["evaluated"], nightly  # the sweep's checkpoint was found and evaluated
        # G-prompt-mismatch: the trial's export carries the template it trained with, which is the nightly suite's.
        assert [(e["train_template"], e["template_mismatch"]) for e in nightly["evaluated"]] == [("qa@1", False)]
        assert single["mlflow_tracking_uri"] == mlflow["url"].replace("http://", "http://rlvr:***@")
        assert swept["n_child_runs"] == 1

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

        # 5. The parameters Prefect stores for every flow run: the secrets of configs and overrides are sealed.
        runs = _flow_runs_since(started)
        names = sorted(name for name, _ in runs)
        assert names.count("pipeline") == 3 and {"ablation-sweep", "nightly-eval"} <= set(names), names
        for name, run in runs:
            assert _hits(canaries, json.dumps(run.parameters)) == [], (name, run.name)
        sealed = [run.parameters for name, run in runs if is_sealed(run.parameters)]
        assert len(sealed) == 3, sealed  # the sweep's shared-stages and trial runs (config), the single run (overrides)

        # 6. Every file left behind: Prefect's database, the MLflow server's store, RLVR_HOME (caches, checkpoints,
        # the warehouse, stage folders); no stage request file is left.
        db = Path(prefect.settings.PREFECT_API_DATABASE_CONNECTION_URL.value().split("///", 1)[1])
        roots = [db.parent, Path(os.environ["PREFECT_HOME"]), tmp_path]
        assert _files_with_hits(canaries, roots, skip={base}) == {}
        assert not list(rlvr_home.rglob("request.json")) and not list(Path(tmp_root()).iterdir())
    finally:
        stop_pid(mlflow["pid"])


def test_the_recorder_redacts_whatever_a_caller_passes(rlvr_home, tmp_path):
    """`record_run` is every flow's one recorder (run folder, MLflow, warehouse): it redacts, so no caller can
    forget. A caller passes secrets everywhere (a table's text and a secret-named column, a copied folder
    included); the files, the tables read back, MLflow (sqlite) and every warehouse table hold none, and a
    second call (a retried task) leaves exactly the same warehouse rows."""
    import duckdb
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlvr_core.core import settings
    from rlvr_core.records.runrecord import record_run
    from rlvr_core.artifacts.storage import open_store
    from rlvr_core.records.tracking import Tracker

    uri, key = "http://rlvr:hunter2@mlflow.example:5000", "AKIA-secret-value"
    masked = "http://rlvr:***@mlflow.example:5000"
    store = open_store(str(tmp_path / "store"))
    tracker = Tracker("recorder", f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = tracker.start_run("r", {})
    row = {"run_id": run_id, "experiment": "recorder", "name": "r", "kind": "pipeline", "status": "FINISHED",
           "artifact_uri": uri, "mlflow_run_id": run_id}
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "notes.md").write_text(f"server {uri}\n")
    pq.write_table(pa.table({"note": [f"at {uri}", None]}), extra / "notes.parquet")
    kwargs = dict(run=row, params={"tracking.tracking_uri": uri, "storage.api_key": key},
                  manifest={"resolved_config": {"tracking": {"tracking_uri": uri}}},
                  config={"tracking": {"tracking_uri": uri}, "aws_secret_access_key": key},
                  summary={"mlflow_tracking_uri": uri}, metrics={"eval/x/accuracy_greedy": 0.5},
                  tables={"evals/extra.parquet": pa.table({"note": [f"see {uri}", "plain"], "api_key": [key, None],
                                                           "n": [1, 2]})},
                  tags={"tracking": uri, "api_key": key}, texts={"report.md": f"MLflow at {uri}"},
                  folders={"probe": extra})
    counts = record_run(store, "recorder/r", tracker, run_id, **kwargs)
    assert counts["runs"] == 1
    assert record_run(store, "recorder/r", tracker, run_id, **kwargs) == counts  # safe to repeat
    folder = tmp_path / "store" / "recorder" / "r"
    text = "".join(p.read_text() for p in folder.iterdir() if p.is_file())
    assert masked in text and "hunter2" not in text
    assert key not in text and (folder / "report.md").read_text() == f"MLflow at {masked}"
    # The tables, read back: text masked, a secret-named column replaced, everything else as passed.
    assert pq.read_table(folder / "evals" / "extra.parquet").to_pylist() == [
        {"note": f"see {masked}", "api_key": "***", "n": 1}, {"note": "plain", "api_key": None, "n": 2}]
    assert pq.read_table(folder / "probe" / "notes.parquet").column("note").to_pylist() == [f"at {masked}", None]
    assert (folder / "probe" / "notes.md").read_text() == f"server {masked}\n"
    assert not any(b"hunter2" in f.read_bytes() or key.encode() in f.read_bytes() for f in folder.rglob("*") if f.is_file())
    run = tracker.client.get_run(run_id).data
    assert "hunter2" not in repr(run.params) + repr(run.tags) and key not in repr(run.params) + repr(run.tags)
    with duckdb.connect(str(settings.warehouse_path()), read_only=True) as con:
        assert con.execute("select count(*) from runs where run_id = ?", [run_id]).fetchone()[0] == 1
        tables = [r[0] for r in con.execute(
            "select table_name from information_schema.tables where table_schema = 'main'").fetchall()]
        dump = {t: repr(con.execute(f'select * from "{t}"').fetchall()) for t in tables}
    assert {"runs", "run_params"} <= set(tables)
    assert masked in dump["run_params"]  # the tracking URI was ingested, masked
    assert [t for t, rows in dump.items() if "hunter2" in rows or key in rows] == []
