"""Prefect tasks of the `pipeline` flow beyond the shared stage tasks in `tasks/stages.py`.

- `train` and `evaluate` are GPU stages: they carry the `gpu` tag (a tag concurrency limit hands out
  the slots) and run in a child process (`tasks/stage_runner.py`), so memory is freed with the process
  and a kill is a transient failure that is retried; the retried training resumes from its checkpoint.
- `open_run` makes a pipeline's MLflow run idempotent: a trial that is re-launched after its worker
  was lost finds its own run (by sweep and trial id) instead of creating a duplicate.
- `record` writes the run folder (config, manifest, Parquet tables) to the artifact store and logs
  params/metrics/artifacts to MLflow; `ingest` (tasks/stages.py) then copies it into the warehouse,
  delete-then-insert per run id, so a retried or re-launched run never duplicates rows.

Retries: transient failures only (`tasks.retry.retry_condition_fn`), with exponential back-off and jitter.
Caching: stage outputs are content-addressed by `rlvr_core.pipeline.cache` (survives processes and workers);
Prefect's own task cache stays off (NO_CACHE) because every task here has side effects.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.tasks import exponential_backoff

from rlvr_core.artifacts.artifacts_index import write_run_index
from rlvr_core.artifacts.storage import ArtifactStore
from rlvr_core.core import settings
from rlvr_core.experiment.config import ExperimentConfig
from rlvr_core.pipeline import stages
from rlvr_core.records.runrecord import upload_run_folder, write_run_folder
from rlvr_core.records.tracking import Tracker, redact_text
from tasks.retry import StageProcessError, killed_by_signal, retry_condition_fn

ROOT = Path(__file__).resolve().parent.parent
GPU_TAG = "gpu"
_RETRY = dict(retries=3, retry_delay_seconds=exponential_backoff(backoff_factor=2), retry_jitter_factor=0.5,
              retry_condition_fn=retry_condition_fn)


def run_stage_process(stage: str, request: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
    """Run `tasks.stage_runner STAGE` in a child process; return its result or raise StageProcessError."""
    try:
        logger = get_run_logger()
        log = logger.info
    except Exception:  # noqa: BLE001 - called outside a run (tests, benchmarks): plain stderr
        def log(msg: str) -> None:
            print(msg, file=sys.stderr, flush=True)
    work = Path(tempfile.mkdtemp(prefix=f"rlvr-{stage}-", dir=_tmp_root()))
    req, res = work / "request.json", work / "result.json"
    req.write_text(json.dumps(request, default=str))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [sys.executable, "-m", "tasks.stage_runner", stage, str(req), str(res)]
    # Same process group as the task: whoever kills the flow run's process group kills the stage with it.
    proc = subprocess.Popen(cmd, cwd=str(ROOT), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1)
    log(f"{stage}: child process {proc.pid}")
    tail: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip()
            if line and "it/s]" not in line:  # progress bars are noise in the run log
                log(f"{stage}: {line}")
                tail = (tail + [line])[-20:]
        code = proc.wait(timeout=timeout_s)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    if res.is_file():
        out = json.loads(res.read_text())
        if out["ok"]:
            return out["result"]
        raise StageProcessError(f"{stage} failed in its process: {out['error_type']}: {out['message']}\n"
                                f"{out['traceback']}", transient=out["transient"], returncode=code,
                                error_type=out["error_type"])
    # No result file: the process died before it could report (a signal, a hard crash).
    raise StageProcessError(f"{stage} process {proc.pid} exited with status {code} without a result"
                            + (" (killed by a signal: retried)" if killed_by_signal(code) else "")
                            + ("\n" + "\n".join(tail) if tail else ""),
                            transient=killed_by_signal(code), returncode=code)


def _tmp_root() -> str:
    d = settings.paths().home / "tmp"
    d.mkdir(parents=True, exist_ok=True)
    return str(d)


# ------------------------------------------------------------------------------------------ GPU stages
@task(name="grpo-train", cache_policy=NO_CACHE, tags=[GPU_TAG], **_RETRY)
def train(cfg: ExperimentConfig, data: stages.DataArtifact, base: stages.ModelArtifact,
          curriculum: stages.CurriculumArtifact, mlflow_run_id: str | None = None) -> stages.TrainArtifact:
    """`mlflow_run_id`: the run that gets the per-step metrics while training runs (docs/tracking.md); the
    stage process reaches it through `cfg.tracking` and the environment, so no credential is written."""
    out = run_stage_process("train", {"config": cfg.resolved(), "data": asdict(data), "base": asdict(base),
                                      "curriculum": asdict(curriculum), "mlflow_run_id": mlflow_run_id})
    return stages.TrainArtifact(model=stages.ModelArtifact(**out.pop("model")), **out)


@task(name="evaluate", cache_policy=NO_CACHE, tags=[GPU_TAG], **_RETRY)
def evaluate(cfg: ExperimentConfig, data: stages.DataArtifact, model: stages.ModelArtifact, eval_id: str,
             checkpoint: str) -> stages.EvalArtifact:
    with tempfile.TemporaryDirectory(dir=_tmp_root()) as tmp:
        out = run_stage_process("evaluate", {"config": cfg.resolved(), "data": asdict(data), "model": asdict(model),
                                             "eval_id": eval_id, "checkpoint": checkpoint, "out_dir": tmp})
        samples, metrics = pq.read_table(out["samples"]), pq.read_table(out["metrics"])
    return stages.EvalArtifact(samples, metrics, {int(k): v for k, v in out["curve"].items()}, out["summary"])


# ------------------------------------------------------------------------------------------ tracking
@task(name="open-mlflow-run", cache_policy=NO_CACHE, **_RETRY)
def open_run(experiment: str, tracking_uri: str | None, name: str, tags: dict[str, Any],
             parent_run_id: str | None = None) -> str:
    """Create the run, or reuse the one a previous launch of the same trial created (same sweep and trial id)."""
    tracker = Tracker(experiment, tracking_uri)
    if tags.get("sweep_id") and tags.get("trial_id"):
        found = tracker.client.search_runs(
            [tracker.experiment_id],
            f"tags.sweep_id = '{tags['sweep_id']}' and tags.trial_id = '{tags['trial_id']}'", max_results=5)
        if found:
            run_id = found[0].info.run_id
            tracker.set_tags(run_id, {**tags, "relaunched": "true"})
            tracker.client.update_run(run_id, status="RUNNING")
            return run_id
    return tracker.start_run(name, tags, parent_run_id=parent_run_id)


@task(name="record-run", cache_policy=NO_CACHE, **_RETRY)
def record(store: ArtifactStore, prefix: str, tracker_args: tuple[str, str | None], run_id: str, *,
           run_row: dict[str, Any], params: dict[str, Any], manifest: dict[str, Any], config_yaml: str,
           summary: dict[str, Any], tables: dict[str, pa.Table], metrics: dict[str, float],
           tags: dict[str, Any], report_md: str, steps_path: str | None) -> str:
    """Run folder → artifact store (run.json last), and the same numbers → MLflow; then the folder's
    index.html (rlvr_core.artifacts.artifacts_index), linking the MLflow run when the tracking URI is a server. Safe to repeat."""
    tracker = Tracker(*tracker_args)
    with tempfile.TemporaryDirectory(prefix="rlvr-run-") as tmp:
        local = write_run_folder(Path(tmp), run=run_row, params=params, manifest=manifest, config_yaml=config_yaml,
                                 summary=summary, tables=tables)
        (local / "report.md").write_text(redact_text(report_md))
        upload_run_folder(store, prefix, local)
        tracker.log_params(run_id, params)
        tracker.log_metrics(run_id, metrics)
        if steps_path:
            tracker.log_step_rows(run_id, pq.read_table(steps_path).to_pylist())  # what training did not send
        tracker.set_tags(run_id, tags)
        tracker.log_artifact(run_id, local)
    links = {"MLflow run": tracker.run_url(run_id)} if tracker.tracking_uri.startswith("http") else None
    write_run_index(store, prefix, links)
    return store.url(prefix)


def new_id() -> str:
    return uuid.uuid4().hex[:8]
