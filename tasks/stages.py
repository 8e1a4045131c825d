"""The pipeline's Prefect tasks: one task per stage of `rlvr_core.pipeline.stages`, plus opening and recording the run.

One retry rule for all of them (`RETRY`): transient failures only (`tasks.retry.retry_condition_fn`: a lost
worker, a killed process, a dropped connection, an S3 hiccup), with exponential back-off and jitter. A
guard firing, a bad input, out of memory (also the kernel's OOM kill of a stage process) or an unrecognised
error is not re-run. This is the only layer that retries a stage's failure: the sweep relaunches a trial's
flow run only when it crashed (`flows.ablation_sweep.TRIAL_RETRY`). Every task is safe to repeat:

- stage outputs are content-addressed by `rlvr_core.pipeline.cache` (they survive processes and workers; with
  `RLVR_STAGE_STORE` they move between workers through the artifact store, and each task finds its inputs on
  its own worker first: `stages.here`), so
  Prefect's own task cache stays off (NO_CACHE) for these side-effecting tasks;
- a retried training stage resumes from its last checkpoint (its folder is keyed by its inputs);
- export reuses a local export that still matches its manifest and verifies the upload from scratch;
- `open_run` finds the MLflow run a previous launch of the same trial created;
- `record` overwrites the run folder and ingests delete-then-insert per run id.

`train` and `evaluate` carry the `gpu` tag (a tag concurrency limit hands out the slots on a cluster) and
run in a child process (`tasks.stage_process`) unless the flow asks for `in_process` (the laptop demo,
where a fresh process per stage would only add start-up time).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import pyarrow.parquet as pq
from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.tasks import exponential_backoff

from rlvr_core.artifacts.storage import ArtifactStore
from rlvr_core.core.progress import SILENT, Progress
from rlvr_core.experiment.config import ExperimentConfig
from rlvr_core.pipeline import stages
from rlvr_core.pipeline.child.errors import OutOfMemory
from rlvr_core.pipeline.child.transient import needs_oom_guard, oom_guard
from rlvr_core.records.runrecord import record_run
from rlvr_core.records.tracking import Tracker
from tasks.retry import retry_condition_fn
from tasks.stage_process import run_stage_process, tmp_root

GPU_TAG = "gpu"
RETRY = dict(retries=3, retry_delay_seconds=exponential_backoff(backoff_factor=2), retry_jitter_factor=0.5,
             retry_condition_fn=retry_condition_fn, cache_policy=NO_CACHE)


@contextlib.contextmanager
def oom_says_what_to_lower(stage: str) -> Iterator[None]:
    """A stage run in this process (no child to report for it): out of memory is re-raised, not retried, with
    the G-oom line as the last line of its message, as a stage child reports it."""
    try:
        yield
    except Exception as e:
        if needs_oom_guard(e):
            raise OutOfMemory(f"{type(e).__name__}: {e}\n{oom_guard(stage)}") from e
        raise


@task(name="make-data", **RETRY)
def make_data(cfg: ExperimentConfig, progress: Progress = SILENT) -> stages.DataArtifact:
    return stages.prepare_data(cfg, progress)


@task(name="warm-start-base-model", tags=["compute"], **RETRY)
def warm_start_base(cfg: ExperimentConfig, data: stages.DataArtifact,
                    progress: Progress = SILENT) -> stages.ModelArtifact:
    return stages.prepare_base_model(cfg, stages.here(data), progress)


@task(name="pass-rate-table", tags=["compute"], **RETRY)
def pass_rate_table(cfg: ExperimentConfig, data: stages.DataArtifact, model: stages.ModelArtifact,
                    progress: Progress = SILENT) -> stages.PassRateArtifact:
    return stages.pass_rate_stage(cfg, stages.here(data), stages.here(model), progress)


@task(name="curriculum", **RETRY)
def build_curriculum(cfg: ExperimentConfig, data: stages.DataArtifact, passrates: stages.PassRateArtifact,
                     progress: Progress = SILENT) -> stages.CurriculumArtifact:
    return stages.curriculum_stage(cfg, stages.here(data), stages.here(passrates), progress)


@task(name="grpo-train", tags=[GPU_TAG], **RETRY)
def train(cfg: ExperimentConfig, data: stages.DataArtifact, base: stages.ModelArtifact,
          curriculum: stages.CurriculumArtifact, mlflow_run_id: str | list[str] | None = None, *,
          in_process: bool = False, progress: Progress = SILENT,
          base_eval: dict[str, float] | None = None) -> stages.TrainArtifact:
    """`mlflow_run_id`: the run (or runs) that get the per-step metrics while training runs (docs/tracking.md);
    a stage process reaches them through `cfg.tracking` and the environment, so no credential is written to disk.
    `base_eval`: G-reward-hacking's reference point (`stages.base_reference`)."""
    data, base, curriculum = stages.here(data), stages.here(base), stages.here(curriculum)
    if in_process:
        with oom_says_what_to_lower("train"):
            return stages.train_stage(cfg, data, base, curriculum, progress, mlflow_run_id=mlflow_run_id,
                                      base_eval=base_eval)
    out = run_stage_process("train", {"config": cfg.resolved(), "data": asdict(data), "base": asdict(base),
                                      "curriculum": asdict(curriculum), "mlflow_run_id": mlflow_run_id,
                                      "base_eval": base_eval})
    return stages.TrainArtifact(model=stages.ModelArtifact(**out.pop("model")), **out)


@task(name="export-checkpoint", **RETRY)
def export(trained: stages.TrainArtifact, base: stages.ModelArtifact, store: ArtifactStore, prefix: str,
           run_manifest: dict | None, progress: Progress = SILENT) -> stages.ExportArtifact:
    return stages.export_stage(stages.here(trained), stages.here(base), store, prefix, run_manifest=run_manifest,
                               progress=progress)


@task(name="evaluate", tags=[GPU_TAG], **RETRY)
def evaluate(cfg: ExperimentConfig, data: stages.DataArtifact, model: stages.ModelArtifact, eval_id: str,
             checkpoint: str, *, in_process: bool = False, progress: Progress = SILENT) -> stages.EvalArtifact:
    data, model = stages.here(data), stages.here(model)
    if in_process:
        with oom_says_what_to_lower("evaluate"):
            return stages.evaluate_stage(cfg, data, model, eval_id=eval_id, checkpoint=checkpoint, progress=progress)
    with tempfile.TemporaryDirectory(dir=tmp_root()) as tmp:
        out = run_stage_process("evaluate", {"config": cfg.resolved(), "data": asdict(data), "model": asdict(model),
                                             "eval_id": eval_id, "checkpoint": checkpoint, "out_dir": tmp})
        samples, metrics, curves = (pq.read_table(out[k]) for k in ("samples", "metrics", "curves"))
    return stages.EvalArtifact(samples, metrics, {int(k): v for k, v in out["curve"].items()}, out["summary"],
                               curves)


@task(name="open-mlflow-run", **RETRY)
def open_run(experiment: str, tracking_uri: str | None, name: str, tags: dict[str, Any],
             parent_run_id: str | None = None) -> str:
    """Create the run, or reuse the one a previous launch of the same trial created (same sweep and trial id)."""
    tracker = Tracker(experiment, tracking_uri)
    if tags.get("sweep_id") and tags.get("trial_id"):
        found = tracker.client.search_runs(
            [tracker.experiment_id],
            f"tags.kind = 'trial' and tags.sweep_id = '{tags['sweep_id']}' and tags.trial_id = '{tags['trial_id']}'",
            max_results=5)
        if found:
            run_id = found[0].info.run_id
            tracker.set_tags(run_id, {**tags, "relaunched": "true"})
            tracker.client.update_run(run_id, status="RUNNING")
            return run_id
    return tracker.start_run(name, tags, parent_run_id=parent_run_id)


# The run's one recorder (artifact store, MLflow, index.html, warehouse), as a retried task; returns warehouse rows.
record = task(name="record-run", **RETRY)(record_run)
