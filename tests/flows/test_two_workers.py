"""One pipeline over two Prefect workers that share no folder: only S3 (moto over HTTP on 127.0.0.1), the MLflow
store and the Prefect server (flows/local_stack.py on 127.0.0.1, no stack workers of its own).

Worker A (CPU pool, its own RLVR_HOME) runs the `pipeline/shared-stages` deployment: data, base model, pass rates,
curriculum. Worker B (GPU pool, another RLVR_HOME) then runs `pipeline/pipeline`: its shared stages are found in
the stage store (`RLVR_STAGE_STORE`, cached, not rebuilt), it trains, exports, evaluates and records. The result
equals the same pipeline run by one process in a third home without a store.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from flows.local_stack import CPU_POOL, GPU_POOL, ROOT, prefect_down, prefect_up, stack_env, start_worker
from tests.prefect_postgres import prefect_database

pytestmark = [pytest.mark.slow, pytest.mark.s3]

# The checks are about where each stage ran and that B's result equals the reference, not about accuracy: the
# smallest sizes that still run every stage (2 GRPO steps of 4 prompts draw 8 of the 16 prompts).
OVERRIDES = {"model.warm_start.steps": 4, "data.synthetic.n_train": 16, "data.synthetic.n_test": 4,
             "passk.n_samples": 2, "passk.ks": [1, 2], "passk.max_prompts": 16, "passk.drop_always_solved": False,
             "sampling.max_new_tokens": 8, "eval.max_new_tokens": 8, "eval.n_samples": 2, "eval.max_problems": 4,
             "eval.verifier_workers": 0, "reward.workers": 0, "grpo.steps": 2, "grpo.prompts_per_step": 4,
             "grpo.group_size": 4, "grpo.eval_every": 0, "grpo.dynamic_sampling": False, "grpo.warmup_steps": 0,
             "grpo.guards.health.no_signal.serious": False}  # a tiny base that learns nothing, by design
PARAMS = {"config": "configs/demo.yaml", "overrides": OVERRIDES}


def _api(state, path: str, body: dict | None = None, tries: int = 5):
    """POST to the Prefect API; a call that times out or answers 503 (SQLite's "database is locked" under a loaded
    machine) is asked again. Creating a flow run carries an idempotency key, so asking again never makes two."""
    req = urllib.request.Request(state["api_url"] + path, data=json.dumps(body or {}).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    for attempt in range(tries):
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return json.loads(r.read())
        except (TimeoutError, ConnectionError, urllib.error.HTTPError) as e:
            if attempt == tries - 1 or (isinstance(e, urllib.error.HTTPError) and e.code != 503):
                raise
            print(f"{path}: {e!r}, asking again", file=sys.stderr)
            time.sleep(2)


def _run_deployment(state, name: str, timeout_s: float = 400) -> dict:
    dep = _api(state, "/deployments/filter", {"deployments": {"name": {"any_": [name]}}})[0]
    run_id = _api(state, f"/deployments/{dep['id']}/create_flow_run", {"parameters": PARAMS, "idempotency_key": f"two-workers-{name}-{uuid.uuid4()}"})["id"]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        [run] = _api(state, "/flow_runs/filter", {"flow_runs": {"id": {"any_": [run_id]}}})
        if run["state_type"] in ("COMPLETED", "FAILED", "CANCELLED", "CRASHED"):
            return run
        time.sleep(1)
    raise AssertionError(f"{name}: flow run {run_id} not final after {timeout_s:.0f} s")


def _one_process(home: Path, api_url: str) -> dict:
    """The same pipeline in one process (training and evaluation in it too, no stage child processes), one home,
    no stage store: the reference."""
    env = {k: v for k, v in stack_env(home, api_url).items() if k not in ("RLVR_STAGE_STORE", "RLVR_ARTIFACT_URI")}
    code = ("import json, sys; from flows.pipeline import pipeline_flow; "
            "print(json.dumps(pipeline_flow(**json.loads(sys.argv[1]), in_process=True, show_progress=False), "
            "default=str))")
    p = subprocess.run([sys.executable, "-c", code, json.dumps(PARAMS)], env=env, cwd=str(ROOT),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_shared_stages_on_one_worker_training_on_another(tmp_path, s3_env, monkeypatch):
    from rlvr_core.artifacts.storage import open_store

    endpoint, bucket = s3_env
    for k, v in {"RLVR_STAGE_STORE": f"s3://{bucket}/stage-cache", "RLVR_ARTIFACT_URI": f"s3://{bucket}/runs",
                 "RLVR_S3_ENDPOINT_URL": endpoint,
                 "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}.items():
        monkeypatch.setenv(k, v)  # what every stack process inherits (stack_env copies this environment)
    home_a, home_b = tmp_path / "worker-a", tmp_path / "worker-b"
    with prefect_database(tmp_path) as database_url:  # PostgreSQL, as `rlvr stack up` runs it
        state = prefect_up(tmp_path / "server", workers=False, database_url=database_url)
        try:
            start_worker(state, CPU_POOL, "cpu-a", home=home_a)
            start_worker(state, GPU_POOL, "gpu-b", home=home_b)
            shared = _run_deployment(state, "shared-stages")
            assert shared["state_type"] == "COMPLETED", shared["state"]
            run = _run_deployment(state, "pipeline")
            assert run["state_type"] == "COMPLETED", run["state"]
            reference = _one_process(tmp_path / "one-home", state["api_url"])
        finally:
            prefect_down(state)

    # A built the shared stages, B fetched them from the store and trained; neither has the other's work.
    for stage in ("data", "base_model", "pass_rate_table", "curriculum"):
        assert list((home_a / "cache" / stage).glob("*/.done")) and list((home_b / "cache" / stage).glob("*/.done"))
    assert not (home_a / "cache" / "grpo").exists() and list((home_b / "cache" / "grpo").glob("*/.done"))
    store = open_store(f"s3://{bucket}/runs")
    [key] = [k for k in store.list("") if k.endswith("/summary.json")]
    summary = json.loads(store.get_text(key))
    assert summary["cached"] == {"data": True, "base_model": True, "pass_rate_table": True, "curriculum": True,
                                 "train": False}
    for k in ("pass_rate_table_id", "curriculum_id", "accuracy_greedy", "passk", "n_eval"):
        assert summary[k] == reference[k], k
    assert summary["train"]["steps"] == reference["train"]["steps"] == 2
    for k, v in reference["train"].items():
        if isinstance(v, float) and not any(t in k for t in ("wall", "time", "duration", "_s_", "per_s")) \
                and not k.endswith("_s"):
            assert summary["train"][k] == pytest.approx(v, rel=1e-6, abs=1e-9, nan_ok=True), k
