"""A demo run against a real `mlflow server` and a real S3 API (moto_server), both started by
`rlvr stack up` on 127.0.0.1: what the run recorded is checked through MLflow's REST API (plain HTTP)
and in the bucket with boto3, never through our own tracking code."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from rlvr_core.records.tracking import STANDARD_TAGS

pytestmark = [pytest.mark.slow, pytest.mark.s3]

STAGES = {"data", "base-model", "passk", "curriculum", "evaluate-base", "train", "export", "evaluate-trained"}


def api(base: str, path: str, method: str = "GET", **kw) -> dict:
    r = requests.request(method, f"{base}/api/2.0/mlflow/{path}", timeout=30, **kw)
    assert r.status_code == 200, (path, r.status_code, r.text[:500])
    return r.json()


def runs_of(base: str, experiment_id: str) -> list[dict]:
    return api(base, "runs/search", "POST", json={"experiment_ids": [experiment_id], "max_results": 100})["runs"]


def tags(run: dict) -> dict[str, str]:
    return {t["key"]: t["value"] for t in run["data"].get("tags", [])}


def params(run: dict) -> dict[str, str]:
    return {p["key"]: p["value"] for p in run["data"].get("params", [])}


def metrics(run: dict) -> dict[str, float]:
    return {m["key"]: m["value"] for m in run["data"].get("metrics", [])}


def test_stack_status_reports_both_services(team_stack, stack_cli):
    home, state = team_stack
    st = stack_cli(home, "status", "--json")
    assert st.returncode == 0, st.stdout + st.stderr
    report = json.loads(st.stdout)
    assert report["components"]["mlflow"]["healthy"] and report["components"]["s3"]["healthy"]
    assert report["components"]["prefect"] == {"skipped": "--no-prefect"}
    assert report["env"]["MLFLOW_TRACKING_URI"] == state["mlflow"]["url"]
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", state["mlflow"]["url"])
    # A second `up` finds the running stack instead of starting another.
    again = stack_cli(home, "up", "--mlflow-port", "0", "--s3-port", "0", "--no-prefect", "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["already_running"] is True


def test_parent_and_child_runs_through_the_rest_api(stack_demo):
    base, s = stack_demo["mlflow"], stack_demo["summary"]
    exp = api(base, "experiments/get-by-name", params={"experiment_name": "team-stack"})["experiment"]
    assert exp["artifact_location"].startswith("mlflow-artifacts:")  # the server owns artifact storage
    runs = {r["info"]["run_id"]: r for r in runs_of(base, exp["experiment_id"])}
    parent = runs[s["mlflow_run_id"]]
    assert parent["info"]["status"] == "FINISHED" and "mlflow.parentRunId" not in tags(parent)
    children = [r for r in runs.values() if tags(r).get("mlflow.parentRunId") == s["mlflow_run_id"]]
    assert {r["info"]["run_name"] for r in children} == STAGES
    assert all(r["info"]["status"] == "FINISHED" for r in children)
    assert {tags(r)["stage"] for r in children} == STAGES - {"evaluate-base", "evaluate-trained"} | {"evaluate"}
    # The same standard tags, with the same values, on the parent and every child.
    expected = {k: tags(parent)[k] for k in STANDARD_TAGS}
    assert expected["config_hash"] == s["config_hash"] and expected["prefect_flow_run_id"] == s["prefect_flow_run_id"]
    assert len(expected["dataset_hash"]) > 8 and expected["sweep_id"] == "" and expected["trial_id"] == ""
    for r in children:
        assert {k: tags(r)[k] for k in STANDARD_TAGS} == expected, r["info"]["run_name"]
    # Params: the whole resolved config on the parent; each child its own sections.
    assert params(parent)["eval.verifier"] == "gsm8k" and params(parent)["grpo.steps"] == "2"
    assert params(parent)["tracking.experiment"] == "team-stack"
    by_name = {r["info"]["run_name"]: r for r in children}
    assert params(by_name["train"])["grpo.group_size"] == "2" and "eval.verifier" not in params(by_name["train"])
    # Metrics: the headline on the parent equals the stage's own and the CLI's summary.
    assert metrics(parent)["eval/synthetic/accuracy_greedy"] == pytest.approx(s["base_pass_at_1"])
    assert metrics(by_name["evaluate-base"])["eval/synthetic/accuracy_greedy"] == pytest.approx(s["base_pass_at_1"])
    assert metrics(by_name["evaluate-trained"])["eval/synthetic/accuracy_greedy"] == pytest.approx(s["trained_pass_at_1"])
    assert metrics(by_name["passk"])["passk/n_problems"] == 8
    assert metrics(by_name["export"])["export/step"] == 2
    history = api(base, "metrics/get-history", params={"run_id": by_name["train"]["info"]["run_id"],
                                                       "metric_key": "train/reward_mean"})["metrics"]
    assert sorted(m["step"] for m in history) == [1, 2]
    # The curves are on the pipeline run too (one click from the runs table), at the same steps.
    history = api(base, "metrics/get-history", params={"run_id": s["mlflow_run_id"],
                                                       "metric_key": "train/reward_mean"})["metrics"]
    assert sorted(m["step"] for m in history) == [1, 2]
    assert all(f"time/{tags(r)['stage']}_s" in metrics(r) for r in children)
    # System metrics were sampled into the parent while the pipeline ran.
    cpu = api(base, "metrics/get-history", params={"run_id": s["mlflow_run_id"],
                                                   "metric_key": "system/cpu_utilization_percentage"})["metrics"]
    assert len(cpu) >= 2


def test_artifacts_go_through_the_server_into_the_bucket(stack_demo, bucket):
    base, s = stack_demo["mlflow"], stack_demo["summary"]
    run_id, exp_id = s["mlflow_run_id"], s["mlflow_experiment_id"]
    listed = api(base, "artifacts/list", params={"run_id": run_id})
    names = {f["path"] for f in listed["files"]}
    assert {"config.yaml", "manifest.json", "run.json", "summary.json", "evals", "passk"} <= names
    # Downloaded through the server's artifact proxy …
    r = requests.get(f"{base}/api/2.0/mlflow-artifacts/artifacts/{exp_id}/{run_id}/artifacts/manifest.json", timeout=30)
    assert r.status_code == 200
    manifest = json.loads(r.content)
    assert manifest["mlflow_run_id"] == run_id and manifest["config_hash"] == s["config_hash"]
    # … and byte-identical to the object in the bucket (the server's --artifacts-destination) …
    obj = bucket.get_object(Bucket="rlvr", Key=f"mlflow/{exp_id}/{run_id}/artifacts/manifest.json")["Body"].read()
    assert obj == r.content
    # … and to the run folder in the artifact store (RLVR_ARTIFACT_URI=s3://rlvr/artifacts).
    # (The folder is named `<run name>-<run id[:8]>`, rlvr_core.artifacts.layout; MLflow's copy keeps MLflow's own ids.)
    assert s["artifact_uri"] == f"s3://rlvr/artifacts/team-stack/demo-{run_id[:8]}"
    assert bucket.get_object(Bucket="rlvr", Key=f"artifacts/team-stack/demo-{run_id[:8]}/manifest.json")["Body"].read() == obj


def test_run_folder_layout_and_index_in_the_bucket(stack_demo, bucket):
    s = stack_demo["summary"]
    prefix = f"artifacts/team-stack/demo-{s['mlflow_run_id'][:8]}/"
    keys = {o["Key"][len(prefix):] for page in bucket.get_paginator("list_objects_v2").paginate(Bucket="rlvr", Prefix=prefix)
            for o in page.get("Contents", [])}
    assert {"config.yaml", "manifest.json", "run.json", "params.json", "summary.json", "index.html",
            "passk/pass_rate_table.parquet", "evals/samples.parquet", "evals/metrics.parquet",
            "curriculum/curriculum.parquet", "train/steps.parquet",
            "checkpoints/final/model.safetensors"} <= keys
    index = bucket.get_object(Bucket="rlvr", Key=prefix + "index.html")["Body"].read().decode()
    hrefs = set(re.findall(r'href="([^"]+)"', index))
    # Every file of the folder is linked, relatively; the only absolute link is the MLflow run page.
    assert keys - {"index.html"} <= hrefs
    assert [h for h in hrefs if "://" in h] == [f"{stack_demo['mlflow']}#/experiments/{s['mlflow_experiment_id']}"
                                                f"/runs/{s['mlflow_run_id']}?workflowType=machine_learning"]


def test_artifacts_cli_browses_the_bucket(stack_demo, env_for):
    """`rlvr artifacts ls` and `open --print` against S3: open copies the run folder (without its
    checkpoints) into a local cache where the index's relative links resolve."""
    s = stack_demo["summary"]
    env = {**env_for(stack_demo["home"]), **stack_demo["state"]["env"]}
    run = f"team-stack/demo-{s['mlflow_run_id'][:8]}"
    code = ("import sys, typer; from rlvr_cli.artifacts import artifacts_ls, "
            "artifacts_open; app = typer.Typer(); app.command('ls')(artifacts_ls); app.command('open')(artifacts_open); "
            "app(sys.argv[1:])")
    ls = subprocess.run([sys.executable, "-c", code, "ls", run], env=env, capture_output=True, text=True, timeout=120)
    assert ls.returncode == 0, ls.stderr
    assert f"{run}/manifest.json" in ls.stdout.split() and f"{run}/checkpoints/final/model.safetensors" in ls.stdout
    op = subprocess.run([sys.executable, "-c", code, "open", run, "--print"], env=env, capture_output=True, text=True,
                        timeout=120)
    assert op.returncode == 0, op.stderr
    page = Path(op.stdout.strip().splitlines()[-1])
    assert page.name == "index.html" and page.is_file()
    assert str(page).startswith(str(stack_demo["home"] / "cache" / "artifact-views" / "rlvr" / "artifacts"))
    for href in re.findall(r'href="([^"]+)"', page.read_text()):
        if "://" not in href and not href.startswith("checkpoints/"):
            assert (page.parent / href).is_file(), href
    # Without --with-checkpoints no weights come: at most each export's small manifest (its page links it).
    fetched = {f.name for f in (page.parent / "checkpoints").rglob("*") if f.is_file()}
    assert fetched <= {"export_manifest.json"}, fetched
    missing = subprocess.run([sys.executable, "-c", code, "open", "team-stack/no-such-run", "--print"], env=env,
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and "no artifact, folder or run 'team-stack/no-such-run' in s3://rlvr/artifacts" in missing.stderr
    # The MLflow run id alone finds the same folder (what `rlvr demo` and the MLflow UI show).
    by_id = subprocess.run([sys.executable, "-c", code, "open", s["mlflow_run_id"], "--print"], env=env,
                           capture_output=True, text=True, timeout=120)
    assert by_id.returncode == 0 and Path(by_id.stdout.strip().splitlines()[-1]) == page, by_id.stderr


def test_artifacts_open_and_ls_take_what_the_demo_printed(stack_demo):
    """The `MLflow run:` and `artifacts:` lines of `rlvr demo`, copied as printed (and the folder URI with a
    trailing slash, the page's MLflow URL, a stage run's id), open the run's page; `ls` groups it."""
    import mlflow
    from typer.testing import CliRunner

    from rlvr_cli.artifacts import artifacts_app

    printed = dict(ln.strip().split(": ", 1) for ln in stack_demo["stderr"].splitlines()
                   if ln.strip().startswith(("MLflow run: ", "artifacts: ")))
    run_id, uri = printed["MLflow run"].split()[0], printed["artifacts"].strip()
    assert uri.startswith("s3://rlvr/artifacts/team-stack/demo-") and run_id == stack_demo["summary"]["mlflow_run_id"]
    exp = stack_demo["summary"]["mlflow_experiment_id"]
    stage = mlflow.MlflowClient(stack_demo["mlflow"]).search_runs(
        [exp], f"tags.mlflow.parentRunId = '{run_id}' and tags.kind = 'stage'")[0].info.run_id
    url = f"{stack_demo['mlflow']}/#/experiments/{exp}/runs/{run_id}?workflowType=machine_learning"
    env = {**stack_demo["state"]["env"], "RLVR_HOME": str(stack_demo["home"])}
    pages = set()
    for ref in (uri, uri + "/", run_id, url, stage):
        res = CliRunner().invoke(artifacts_app, ["open", ref, "--print"], env=env)
        assert res.exit_code == 0, (ref, res.output[-2000:])
        pages.add(res.output.strip().splitlines()[-1])
    assert len(pages) == 1 and pages.pop().endswith(f"team-stack/demo-{run_id[:8]}/index.html")
    ls = CliRunner().invoke(artifacts_app, ["ls", "team-stack"], env=env)
    row = next(ln.split() for ln in ls.output.splitlines() if f"team-stack/demo-{run_id[:8]}/" in ln)
    assert row[0] == "run" and int(row[2]) >= 10 and row[3] == "files", ls.output
