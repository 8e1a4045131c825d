"""End to end on a real local stack: Prefect server + process workers on 127.0.0.1 (flows/local_stack.py),
deployments from infra/prefect/prefect.yaml, driven with the `prefect` CLI like a user would.

One stack for the module (its start-up and the tiny base model are paid once):
1. `prefect deployment run 'ablation-sweep/demo-2x2'`: one MLflow parent with four child runs, a
   four-row warehouse pivot, one shared pass-rate table.
2. `nightly-eval` twice: the four new checkpoints are evaluated once; the second run is a no-op.
3. Fault injection: the GPU worker's process group (worker, trial flow run, trainer) is SIGKILLed
   after the trainer's first checkpoint; a new worker starts; the lost-worker automation marks the run
   Crashed, the sweep launches the trial again, and it resumes from the checkpoint: the step count
   continues and the warehouse holds each step once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from flows.local_stack import GPU_POOL, ROOT, prefect_down, prefect_up, stack_env, start_worker

pytestmark = pytest.mark.slow

TINY_EVAL = {"data.synthetic.n_train": 400, "data.synthetic.n_test": 40, "eval.n_samples": 2,
             "eval.verifier_workers": 0}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    home = tmp_path_factory.mktemp("stack")
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".rlvr" / "torch_extensions"))  # compiled once
    state = prefect_up(home)
    try:
        yield state
    finally:
        prefect_down(state)


def prefect_cli(state, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = stack_env(Path(state["home"]), state["api_url"])
    return subprocess.run([str(Path(os.sys.executable).parent / "prefect"), *args], env=env, cwd=str(ROOT),
                          capture_output=True, text=True, timeout=timeout)


def mlflow_client(state):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{Path(state['home']) / 'mlflow' / 'mlflow.db'}")


def wh(state, sql, params=None):
    from rlvr_core import warehouse

    return warehouse.query_records(sql, params, Path(state["home"]) / "warehouse.duckdb")


def sweep_runs(state, sweep_name):
    c = mlflow_client(state)
    exp = c.get_experiment_by_name("rlvr-sweeps")
    parents = c.search_runs([exp.experiment_id], f"tags.kind = 'sweep' and tags.sweep_name = '{sweep_name}'")
    assert len(parents) == 1, [p.data.tags for p in parents]
    children = c.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parents[0].info.run_id}'")
    return parents[0], children


def test_sweep_2x2_through_the_cli(stack):
    proc = prefect_cli(stack, "deployment", "run", "ablation-sweep/demo-2x2", "--watch", timeout=900)
    assert proc.returncode == 0 and "Completed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    parent, children = sweep_runs(stack, "demo-2x2")
    assert parent.info.status == "FINISHED"
    assert len(children) == 4 and all(c.info.status == "FINISHED" for c in children)
    assert sorted(c.data.tags["trial_id"] for c in children) == ["t00", "t01", "t02", "t03"]
    assert {(c.data.params["grpo.loss_agg"], float(c.data.params["grpo.lr"])) for c in children} == \
        {(a, b) for a in ("token-mean", "seq-mean-token-mean") for b in (1e-5, 5e-5)}
    sweep_id = parent.data.tags["sweep_id"]
    from flows.ablation_sweep import sweep_pivot

    pivot = sweep_pivot(sweep_id, ["grpo.loss_agg", "grpo.lr"], path=Path(stack["home"]) / "warehouse.duckdb")
    assert len(pivot) == 4 and all(r["n_seeds"] == 1 and 0 <= r["ci_low"] <= r["mean"] <= r["ci_high"] <= 1
                                   for r in pivot)
    # Each cell's number is its child run's trained greedy accuracy.
    by_trial = {c.data.tags["trial_id"]: c.data.metrics["eval/synthetic/trained/accuracy_greedy"] for c in children}
    assert sorted((r["trial_ids"][0], r["mean"]) for r in pivot) == sorted(by_trial.items())
    # The shared stage ran once: every trial trained on the same pass-rate table, which is one cache entry.
    tables = wh(stack, "select distinct table_id from pass_rate_tables p join runs r using (run_id) where r.kind = 'trial'")
    assert len(tables) == 1
    assert len(list((Path(stack["home"]) / "cache" / "pass_rate_table").glob("[0-9a-f]*"))) == 1
    assert wh(stack, "select count(*) as n from runs where kind = 'trial'") == [{"n": 4}]


def test_nightly_eval_evaluates_new_checkpoints_once(stack):
    params = ["--param", f"overrides={json.dumps(TINY_EVAL)}"]
    first = prefect_cli(stack, "deployment", "run", "nightly-eval/nightly", *params, "--watch", timeout=900)
    assert first.returncode == 0 and "Completed" in first.stdout, first.stdout[-3000:] + first.stderr[-3000:]
    evals = wh(stack, "select run_id from runs where kind = 'eval'")
    ckpts = wh(stack, "select count(*) as n from runs where kind = 'trial'")[0]["n"]
    assert len(evals) == ckpts == 4
    # Each checkpoint's nightly greedy accuracy equals the pipeline's own evaluation of it (same suite settings).
    same = wh(stack, """select count(*) as n from eval_metrics a join eval_metrics b
                        on a.checkpoint = b.checkpoint and a.metric = b.metric
                        where a.eval_id = 'trained' and b.eval_id like 'nightly-%' and a.metric = 'accuracy_greedy'
                        and abs(a.value - b.value) < 1e-12""")
    assert same == [{"n": 4}]
    second = prefect_cli(stack, "deployment", "run", "nightly-eval/nightly", *params, "--watch", timeout=600)
    assert second.returncode == 0, second.stdout[-3000:]
    assert [r["run_id"] for r in wh(stack, "select run_id from runs where kind = 'eval'")] == [r["run_id"] for r in evals]
    reports = sorted((Path(stack["home"]) / "artifacts" / "nightly-eval" / "reports").glob("*.md"))
    assert len(reports) == 2 and "Nothing new" in reports[-1].read_text() and "Nothing new" not in reports[0].read_text()


def _trainer_folder(home: Path, steps: int) -> Path | None:
    for key in (home / "cache" / "grpo").glob("*/cache_key.json"):
        if json.loads(key.read_text())["grpo"]["steps"] == steps:
            return key.parent
    return None


def test_lost_worker_trial_resumes_from_its_checkpoint(stack, tmp_path):
    home = Path(stack["home"])
    steps = 12
    sweep = tmp_path / "fault.yaml"
    demo = yaml.safe_load((ROOT / "configs" / "sweeps" / "demo_2x2.yaml").read_text())
    sweep.write_text(yaml.safe_dump({"name": "fault-1", "base": str(ROOT / "configs" / "demo.yaml"),
                                     "set": {**demo["set"], "grpo.steps": steps, "grpo.checkpoint_every": 2},
                                     "grid": {"grpo.lr": [2.0e-5]}}))
    env = stack_env(home, stack["api_url"])
    watcher = subprocess.Popen([str(Path(os.sys.executable).parent / "prefect"), "deployment", "run",
                                "ablation-sweep/demo-2x2", "--param", f"sweep={sweep}", "--watch"],
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
    summary = json.loads((home / "artifacts" / "rlvr-sweeps" / run_id / "summary.json").read_text())
    resumed = summary["train"]["resumed_from_step"]
    assert resumed >= int(killed_at.removeprefix("step")) >= 2 and summary["train"]["steps"] == steps
    # Every step exactly once in the warehouse, one run row, one trial.
    rows = wh(stack, "select step, count(*) as n from train_steps where run_id = ? and metric = 'reward_mean' "
                     "group by step order by step", [run_id])
    assert [r["step"] for r in rows] == list(range(1, steps + 1)) and all(r["n"] == 1 for r in rows)
    assert wh(stack, "select count(*) as n from runs where run_id = ?", [run_id]) == [{"n": 1}]
