"""The `pipeline` flow, the one flow behind every experiment: data → base model → pass@k filter → curriculum
→ (base evaluation) → GRPO training → export → evaluation of the exported checkpoint → record → report.

    rlvr demo                                          (this flow, the demo config, stages in-process)
    prefect deployment run 'pipeline/pipeline' --param config=configs/demo.yaml \\
        --param overrides='{"grpo.enabled": true, "grpo.steps": 20}'

`ablation-sweep` launches it once per trial (its own flow run on the GPU work pool) with the resolved
trial config, the MLflow parent run id and the sweep/trial ids. A trial that is launched again (its worker
was lost) reuses its MLflow run and artifact prefix, the cached stages, and the training checkpoints,
so it resumes where it stopped and writes its warehouse rows once. `stop_after="curriculum"` runs only
the shared stages and opens no MLflow run (the sweep uses it to compute the pass-rate table once).

Tracking (docs/tracking.md): one MLflow run per pipeline (the resolved config as params, the headline
numbers, the run folder as artifacts, system metrics) with one child run per stage (its config
sections, its own metrics and tags). The run's record (summary, warehouse row, manifest, tables, report) is
composed by `rlvr_core.pipeline.run_record` and written by `rlvr_core.records.runrecord.record_run`, which
redacts, so nothing this flow records holds a secret; Prefect stores its parameters sealed (flows/sealed.py).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from prefect.artifacts import create_link_artifact, create_markdown_artifact
from prefect.runtime import flow_run

from flows.sealed import sealed_flow
from rlvr_core.artifacts import layout
from rlvr_core.artifacts.storage import join, open_store
from rlvr_core.core import settings
from rlvr_core.core import manifest as manifest_mod
from rlvr_core.core.progress import Progress
from rlvr_core.data.templates import get_template
from rlvr_core.experiment.config import ExperimentConfig, apply_overrides, load_config, parse_config
from rlvr_core.experiment.guard_coverage import guard_coverage, unguarded_line
from rlvr_core.experiment.guards import GuardError, RunStopped
from rlvr_core.experiment.secrets import unseal
from rlvr_core.pipeline import stages
from rlvr_core.pipeline.child.run import ROOT
from rlvr_core.pipeline.run_record import (PipelineRun, StageOutputs, eval_metrics, finished_record, passk_metrics,
                                           run_params, stopped_record)
from rlvr_core.records.redact import redact, redact_text
from rlvr_core.records.tracking import Tracker, common_tags
from tasks import stages as t

STOP_AFTER = ("curriculum", None)
KINDS = ("pipeline", "demo")  # a run with a sweep id is a "trial"


def resolve_config(config: dict[str, Any] | str, overrides: dict[str, Any] | None = None,
                   source: str = "<pipeline parameter config>") -> ExperimentConfig:
    """A path (relative to the project root when not found from the cwd) or a mapping, plus dotted overrides.
    Secrets sealed in them (a run started from stored parameters: flows.sealed) come from the environment."""
    overrides = unseal(overrides, source, path="overrides")
    if isinstance(config, str):
        p = Path(config)
        if not p.is_absolute() and not p.exists():
            p = ROOT / p
        return load_config(p, overrides)
    return parse_config(apply_overrides(unseal(config, source, path="config"), overrides or {}), source)


@sealed_flow(name="pipeline", log_prints=True, validate_parameters=False)
def pipeline_flow(config: dict[str, Any] | str = "configs/demo.yaml", overrides: dict[str, Any] | None = None,
                  parent_run_id: str | None = None, sweep_id: str | None = None, trial_id: str | None = None,
                  trial_label: str | None = None, eval_base: bool = False, stop_after: str | None = None,
                  kind: str = "pipeline", in_process: bool = False, show_progress: bool = True,
                  source: str = "<pipeline parameter config>") -> dict[str, Any]:
    """`eval_base`: also evaluate the base model (always when training is off) and compare the two, paired;
    `in_process`: run training and evaluation in this process rather than a child process per stage;
    `kind`: how the run is labelled (`demo` or `pipeline`; `trial` when it has a sweep id)."""
    if stop_after not in STOP_AFTER:
        raise ValueError(f"stop_after must be one of {STOP_AFTER}, got {stop_after!r}")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    settings.configure_environment()
    t0 = time.monotonic()
    cfg = resolve_config(config, overrides, source)  # ConfigError (file + field) before any work
    progress = Progress(show_progress)
    if stop_after == "curriculum":
        data, model, passrates, curriculum = _shared_stages(cfg, progress, None)
        return {"pass_rate_table_id": passrates.table_id, "curriculum_id": curriculum.curriculum_id,
                "cached": {"pass_rate_table": passrates.cached, "curriculum": curriculum.cached},
                "duration_s": round(time.monotonic() - t0, 2)}
    run = _open(cfg, "trial" if sweep_id else kind, parent_run_id, sweep_id, trial_id, trial_label)
    progress("tracking", f"MLflow run {run.run_id} in experiment {cfg.tracking.experiment!r} "
                         f"({run.tracker.display_uri})")
    try:
        with run.tracker.system_metrics(run.run_id):
            summary = _run(cfg, run, progress, eval_base or not cfg.grpo.enabled, in_process, t0)
        run.tracker.end_run(run.run_id, "FINISHED")
        summary["duration_s"] = round(time.monotonic() - t0, 2)
        return summary
    except BaseException:
        # A failed stage fails the flow (the exception propagates); the MLflow run says so too.
        try:
            run.tracker.end_run(run.run_id, "FAILED")
        except Exception:  # noqa: BLE001 - the tracking server being down must not hide the real error
            pass
        raise


# ------------------------------------------------------------------------------------------ the run
def _open(cfg: ExperimentConfig, kind: str, parent_run_id: str | None, sweep_id: str | None,
          trial_id: str | None, trial_label: str | None) -> PipelineRun:
    chash = cfg.config_hash()
    template = get_template(cfg.prompt.template)
    git = manifest_mod.git_state()
    prefect_id = str(flow_run.id) if flow_run.id else None
    tracking_uri = settings.mlflow_tracking_uri(cfg.tracking.tracking_uri)
    common = common_tags(config_hash=chash, git_sha=git["sha"], prefect_flow_run_id=prefect_id,
                         sweep_id=sweep_id, trial_id=trial_id)
    name = layout.mlflow_run_name(kind, name=cfg.name, sweep_id=sweep_id, trial_id=trial_id, trial_label=trial_label)
    run_id = t.open_run(cfg.tracking.experiment, tracking_uri, name,
                        {**common, "kind": kind, "git_dirty": git["dirty"], "prompt_template": template.key,
                         "trial_label": trial_label}, parent_run_id)
    tracker = Tracker(cfg.tracking.experiment, tracking_uri, common=common)
    tracker.adopt(run_id)
    # <experiment>/<sweep>/<trial>/ for a trial, <experiment>/<name>-<run id[:8]>/ otherwise (rlvr_core.artifacts.layout)
    prefix = layout.pipeline_prefix(cfg.tracking.experiment, cfg.name, run_id, sweep_id, trial_id, trial_label)
    return PipelineRun(cfg, kind, run_id, name, tracker,
                       open_store(cfg.storage.artifact_uri, cfg.storage.s3_endpoint_url), prefix,
                       redact(cfg.resolved()), chash, template.key, git, prefect_id,
                       {"sweep_id": sweep_id, "trial_id": trial_id, "trial_label": trial_label})


def _run(cfg: ExperimentConfig, run: PipelineRun, progress: Progress, eval_base: bool, in_process: bool,
         t0: float) -> dict[str, Any]:
    run.tracker.log_params(run.run_id, run_params(run))  # first: a run that fails later still shows what it was
    unguarded = unguarded_line(guard_coverage(cfg))  # what no guard watches in this run, said before any work
    if unguarded:
        progress("guards", unguarded)
    data, model, passrates, curriculum = _shared_stages(cfg, progress, run)
    base_eval = trained = exported = trained_eval = None
    training = False  # past the base evaluation: a failure may be a guard's stop in a stage process
    try:
        if cfg.grpo.enabled:  # G-no-signal: a curriculum the base never solves stops before the base evaluation
            stages.no_signal_before_training(cfg, model, curriculum)
        if eval_base:
            with run.stage("evaluate-base", "eval", stage="evaluate", eval_id="base") as child:
                base_eval = t.evaluate(cfg, data, model, "base", "base", in_process=in_process, progress=progress)
                run.tracker.log_metrics(child, eval_metrics(base_eval))
        if cfg.grpo.enabled:
            # The base evaluation is G-reward-hacking's reference point (on the periodic evaluation's slice).
            reference = stages.base_reference(cfg, data, base_eval) if base_eval else None
            training = True
            trained, exported, trained_eval = _train(cfg, run, data, model, curriculum, progress, in_process,
                                                     reference)
    except Exception as err:
        if cfg.grpo.enabled and (training or isinstance(err, GuardError)):
            stopped = _recorded_stop(run, StageOutputs(data, model, passrates, curriculum, base_eval, None, None, None),
                                     progress, t0)
            if stopped is not None:  # what the CLI's one-line stop message names (rlvr_cli/stops.py)
                raise RunStopped(str(err), record=stopped) from err
        raise
    evals = StageOutputs(data, model, passrates, curriculum, base_eval, trained, exported, trained_eval)
    return _record(run, evals, progress, t0)


def _shared_stages(cfg: ExperimentConfig, progress: Progress, run: PipelineRun | None):
    """The stages every trial of a sweep shares (all cached on their inputs): data, base model, pass-rate
    table, curriculum. With a run, each is a child run; without one (stop_after="curriculum") none is."""
    stage = run.stage if run else (lambda *a, **k: contextlib.nullcontext())
    tracker = run.tracker if run else None
    with stage("data", "data") as child:
        data = t.make_data(cfg, progress)
        if tracker:
            tracker.add_common_tags(dataset_hash=data.dataset_hash)  # now known: stamp it on every run
            tracker.log_metrics(child, {"data/n_train": data.n_train, "data/n_test": data.n_test})
            tracker.set_tags(child, {"cached": data.cached})
    with stage("base-model", "model") as child:
        model = t.warm_start_base(cfg, data, progress)
        if tracker:
            tracker.set_tags(child, {"model_id": model.model_id, "model_hash": model.model_hash,
                                     "tokenizer_hash": model.tokenizer_hash, "cached": model.cached})
    stages.teacher_before_training(cfg, model)  # a distillation teacher the student cannot share: before pass rates
    with stage("passk", "passk", "sampling", "prompt", "reward") as child:
        passrates = t.pass_rate_table(cfg, data, model, progress)
        if tracker:
            tracker.log_metrics(child, passk_metrics(passrates))
            tracker.set_tags(child, {"pass_rate_table_id": passrates.table_id, "cached": passrates.cached})
    with stage("curriculum", "curriculum") as child:
        curriculum = t.build_curriculum(cfg, data, passrates, progress)
        if tracker:
            tracker.log_metrics(child, {"curriculum/n_prompts": curriculum.n_prompts})
            tracker.set_tags(child, {"curriculum_id": curriculum.curriculum_id, "cached": curriculum.cached})
    return data, model, passrates, curriculum


def _train(cfg: ExperimentConfig, run: PipelineRun, data, model, curriculum, progress: Progress, in_process: bool,
           base_reference: dict[str, float] | None = None):
    """GRPO, then export, then evaluation of the exported, uploaded and checksum-verified copy (G-lost-ckpt):
    the numbers belong to the checkpoint users will download."""
    with run.stage("train", "grpo", "reward") as child:
        # The curves go to the stage run and to the pipeline (trial) run itself: one click from the runs table.
        trained = t.train(cfg, data, model, curriculum, [child, run.run_id], in_process=in_process,
                          progress=progress, base_eval=base_reference)
        rows = pq.read_table(trained.steps_path).to_pylist()
        for run_id in (child, run.run_id):
            run.tracker.log_step_rows(run_id, rows)  # only what is missing
    with run.stage("export") as child:
        exported = t.export(trained, model, run.store, join(run.prefix, "checkpoints", "final"),
                            {"config_hash": run.config_hash, "mlflow_run_id": run.run_id, "git_sha": run.git["sha"],
                             "experiment": cfg.tracking.experiment, **run.sweep}, progress)
        run.tracker.log_metrics(child, {"export/step": exported.step})
        run.tracker.set_tags(child, {"export_uri": exported.uri, "export_dtype": exported.dtype,
                                     "export_manifest_sha256": exported.manifest_sha256})
    with run.stage("evaluate-trained", "eval", stage="evaluate", eval_id="trained") as child:
        trained_eval = t.evaluate(cfg, data, exported.model, "trained", exported.uri, in_process=in_process,
                                  progress=progress)
        run.tracker.log_metrics(child, eval_metrics(trained_eval))
    return trained, exported, trained_eval


# ------------------------------------------------------------------------------------------ recording
def _record(run: PipelineRun, ev: StageOutputs, progress: Progress, t0: float) -> dict[str, Any]:
    """Record a finished run (its record composed by rlvr_core.pipeline.run_record) and publish its summary."""
    with finished_record(run.cfg, run, ev, progress, t0) as rec:
        counts = t.record(run.store, run.prefix, run.tracker, run.run_id, **rec.files)
    progress("record", f"artifacts at {run.store.url(run.prefix)} "
                       f"(index: {run.store.url(join(run.prefix, 'index.html'))})")
    progress("warehouse", f"ingested {sum(counts.values())} rows into {settings.warehouse_path()}")
    rec.summary["warehouse_rows"] = counts
    _publish(rec.summary, rec.report_md, run)
    return rec.summary


def _recorded_stop(run: PipelineRun, ev: StageOutputs, progress: Progress, t0: float) -> dict[str, Any] | None:
    """Record a run a guard stopped (`_record_stopped`); None for any other failure, or when recording failed (the
    stage's own error is then the one raised)."""
    try:
        return _record_stopped(run, ev, progress, t0)
    except Exception as exc:  # noqa: BLE001 - the stage's own error is the one to raise
        progress("record", f"could not record the stopped run: {type(exc).__name__}: {exc}")
        return None


def _record_stopped(run: PipelineRun, ev: StageOutputs, progress: Progress, t0: float) -> dict[str, Any] | None:
    """Record what a run that a serious guard stopped has (`stopped_record`); None when no guard stopped it."""
    rec = stopped_record(run.cfg, run, ev, t0)
    if rec is None:
        return None
    t.record(run.store, run.prefix, run.tracker, run.run_id, **rec.files)
    progress("record", f"training stopped by a guard at step {rec.summary['stopped_at_step']} "
                       f"({rec.summary['reasons']}); recorded at {run.store.url(run.prefix)}")
    return rec.summary


def _publish(summary: dict[str, Any], report_md: str, run: PipelineRun) -> None:
    """Prefect artifacts: the run's markdown summary and links to MLflow and the artifact store."""
    sweep_id, trial_id = run.sweep["sweep_id"], run.sweep["trial_id"]
    key = "pipeline-" + (f"{sweep_id}-{trial_id}" if sweep_id else run.run_id)
    key = "".join(c if c.isalnum() or c == "-" else "-" for c in key.lower())[:100]
    create_markdown_artifact(redact_text(report_md), key=key, description="pipeline run summary")
    create_link_artifact(summary["mlflow_run_url"], link_text=f"MLflow run {run.run_id}", key=key + "-mlflow")
    create_link_artifact(summary["artifact_uri"], link_text="artifact store folder", key=key + "-artifacts")
