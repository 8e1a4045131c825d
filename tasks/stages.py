"""Prefect tasks over the pipeline stages in `rlvr_core.pipeline.stages`: retries, tags and names live here.

Stage results are cached by `rlvr_core.pipeline.cache` on content hashes (it survives processes and needs no
result persistence), so Prefect's own task cache is off (NO_CACHE) for these side-effecting tasks.
"""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from rlvr_core.artifacts.storage import ArtifactStore
from rlvr_core.core.progress import Progress
from rlvr_core.experiment.config import ExperimentConfig
from rlvr_core.pipeline import stages
from rlvr_core.records import warehouse
from tasks.retry import retry_condition_fn


@task(name="make-data", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=2)
def make_data(cfg: ExperimentConfig, progress: Progress) -> stages.DataArtifact:
    return stages.prepare_data(cfg, progress)


@task(name="warm-start-base-model", cache_policy=NO_CACHE, tags=["compute"])
def warm_start_base(cfg: ExperimentConfig, data: stages.DataArtifact, progress: Progress) -> stages.ModelArtifact:
    return stages.prepare_base_model(cfg, data, progress)


@task(name="pass-rate-table", cache_policy=NO_CACHE, tags=["compute"])
def pass_rate_table(cfg: ExperimentConfig, data: stages.DataArtifact, model: stages.ModelArtifact,
                    progress: Progress) -> stages.PassRateArtifact:
    return stages.pass_rate_stage(cfg, data, model, progress)


@task(name="curriculum", cache_policy=NO_CACHE)
def build_curriculum(cfg: ExperimentConfig, data: stages.DataArtifact, passrates: stages.PassRateArtifact,
                     progress: Progress) -> stages.CurriculumArtifact:
    return stages.curriculum_stage(cfg, data, passrates, progress)


# Retried training resumes from its last checkpoint (the stage folder is keyed by its inputs).
# One retry rule for every flow (tasks/retry.py): transient failures only; a guard, a bad input or an
# unrecognised error is not re-run.
@task(name="grpo-train", cache_policy=NO_CACHE, tags=["compute"], retries=1, retry_delay_seconds=5,
      retry_condition_fn=retry_condition_fn)
def train(cfg: ExperimentConfig, data: stages.DataArtifact, base: stages.ModelArtifact,
          curriculum: stages.CurriculumArtifact, progress: Progress,
          mlflow_run_id: str | None = None) -> stages.TrainArtifact:
    """`mlflow_run_id`: the run that gets the per-step metrics while training runs (docs/tracking.md)."""
    return stages.train_stage(cfg, data, base, curriculum, progress, mlflow_run_id=mlflow_run_id)


# Retried on transient storage errors: the local export is reused when it still matches its manifest,
# and the upload is verified from scratch each time.
@task(name="export-checkpoint", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2)
def export(trained: stages.TrainArtifact, base: stages.ModelArtifact, store: ArtifactStore, prefix: str,
           run_manifest: dict | None, progress: Progress) -> stages.ExportArtifact:
    return stages.export_stage(trained, base, store, prefix, run_manifest=run_manifest, progress=progress)


@task(name="evaluate", cache_policy=NO_CACHE, tags=["compute"])
def evaluate(cfg: ExperimentConfig, data: stages.DataArtifact, model: stages.ModelArtifact, eval_id: str,
             checkpoint: str, progress: Progress) -> stages.EvalArtifact:
    return stages.evaluate_stage(cfg, data, model, eval_id=eval_id, checkpoint=checkpoint, progress=progress)


# Ingest is idempotent (delete-then-insert per run), so a retry after a lock timeout or S3 error is safe.
@task(name="warehouse-ingest", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2)
def ingest(store: ArtifactStore, run_prefix: str) -> dict[str, int]:
    return warehouse.ingest_run(store, run_prefix)
