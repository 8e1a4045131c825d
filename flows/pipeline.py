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
sections, its own metrics and tags). Recording goes through `rlvr_core.records.runrecord.record_run`, which
redacts, so nothing this flow records holds a secret; Prefect stores its parameters sealed (flows/sealed.py).
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq
from prefect.artifacts import create_link_artifact, create_markdown_artifact
from prefect.runtime import flow_run

from flows.sealed import sealed_flow
from rlvr_core.artifacts import layout
from rlvr_core.artifacts.storage import ArtifactStore, join, open_store
from rlvr_core.core import settings
from rlvr_core.core.numerics import numerics
from rlvr_core.core import manifest as manifest_mod
from rlvr_core.core.progress import Progress
from rlvr_core.data.templates import get_template
from rlvr_core.eval.compare import compare, from_tables, write_report
from rlvr_core.eval.metrics import regression_flag
from rlvr_core.experiment.config import ExperimentConfig, apply_overrides, load_config, parse_config
from rlvr_core.experiment.guard_coverage import guard_coverage
from rlvr_core.experiment.secrets import unseal
from rlvr_core.grpo.checkpointing import ROLLOUTS_FILE, STEPS_FILE
from rlvr_core.pipeline import stages
from rlvr_core.probe.report import ProbeSettings, run_rl_probe
from rlvr_core.probe.tables import Checkpoint
from rlvr_core.probe.task import TaskSettings
from rlvr_core.records import warehouse
from rlvr_core.records.tracking import Tracker, common_tags, config_params, redact, redact_text
from tasks import stages as t
from tasks.stage_process import ROOT

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
@dataclass
class _Run:
    """What every stage of one pipeline run shares: its identity, where it records, its MLflow runs."""

    cfg: ExperimentConfig
    kind: str
    run_id: str
    name: str
    tracker: Tracker
    store: ArtifactStore
    prefix: str
    public: dict[str, Any]  # the resolved config as recorded anywhere: redacted
    config_hash: str
    template_key: str
    git: dict[str, Any]
    prefect_id: str | None
    sweep: dict[str, str | None]  # sweep_id, trial_id, trial_label
    started: str = field(default_factory=lambda: time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()))
    children: dict[str, str] = field(default_factory=dict)

    @contextlib.contextmanager
    def stage(self, name: str, *sections: str, **tags: Any) -> Iterator[str]:
        """A child run for one stage, with its config sections as params."""
        with self.tracker.child_run(self.run_id, tags.pop("stage", name), name=name, tags=tags,
                                    params=config_params(self.public, *sections)) as child:
            self.children[name] = child
            yield child


def _open(cfg: ExperimentConfig, kind: str, parent_run_id: str | None, sweep_id: str | None,
          trial_id: str | None, trial_label: str | None) -> _Run:
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
    return _Run(cfg, kind, run_id, name, tracker, open_store(cfg.storage.artifact_uri, cfg.storage.s3_endpoint_url),
                prefix, redact(cfg.resolved()), chash, template.key, git, prefect_id,
                {"sweep_id": sweep_id, "trial_id": trial_id, "trial_label": trial_label})


def _run(cfg: ExperimentConfig, run: _Run, progress: Progress, eval_base: bool, in_process: bool,
         t0: float) -> dict[str, Any]:
    run.tracker.log_params(run.run_id, _params(run))  # first: a run that fails later still shows what it was
    data, model, passrates, curriculum = _shared_stages(cfg, progress, run)
    base_eval = trained = exported = trained_eval = None
    if eval_base:
        with run.stage("evaluate-base", "eval", stage="evaluate", eval_id="base") as child:
            base_eval = t.evaluate(cfg, data, model, "base", "base", in_process=in_process, progress=progress)
            run.tracker.log_metrics(child, _eval_metrics(base_eval))
    if cfg.grpo.enabled:
        # The base evaluation is G-reward-hacking's reference point (on the periodic evaluation's slice).
        reference = stages.base_reference(cfg, data, base_eval) if base_eval else None
        try:
            trained, exported, trained_eval = _train(cfg, run, data, model, curriculum, progress, in_process,
                                                     reference)
        except BaseException as err:
            try:
                stopped = _record_stopped(cfg, run, _Evals(data, model, passrates, curriculum, base_eval, None,
                                                           None, None), progress, t0)
                if stopped is not None:  # what the CLI's one-line stop message names (rlvr_cli/stops.py)
                    err.rlvr_stopped = stopped
            except Exception as exc:  # noqa: BLE001 - the stage's own error is the one to raise
                progress("record", f"could not record the stopped run: {type(exc).__name__}: {exc}")
            raise
    evals = _Evals(data, model, passrates, curriculum, base_eval, trained, exported, trained_eval)
    return _record(cfg, run, evals, progress, t0)


def _shared_stages(cfg: ExperimentConfig, progress: Progress, run: _Run | None):
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
    with stage("passk", "passk", "sampling", "prompt", "reward") as child:
        passrates = t.pass_rate_table(cfg, data, model, progress)
        if tracker:
            tracker.log_metrics(child, _passk_metrics(passrates))
            tracker.set_tags(child, {"pass_rate_table_id": passrates.table_id, "cached": passrates.cached})
    with stage("curriculum", "curriculum") as child:
        curriculum = t.build_curriculum(cfg, data, passrates, progress)
        if tracker:
            tracker.log_metrics(child, {"curriculum/n_prompts": curriculum.n_prompts})
            tracker.set_tags(child, {"curriculum_id": curriculum.curriculum_id, "cached": curriculum.cached})
    return data, model, passrates, curriculum


def _train(cfg: ExperimentConfig, run: _Run, data, model, curriculum, progress: Progress, in_process: bool,
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
        run.tracker.log_metrics(child, _eval_metrics(trained_eval))
    return trained, exported, trained_eval


# ------------------------------------------------------------------------------------------ recording
@dataclass
class _Evals:
    """Every stage output a run records."""

    data: stages.DataArtifact
    model: stages.ModelArtifact
    passrates: stages.PassRateArtifact
    curriculum: stages.CurriculumArtifact
    base_eval: stages.EvalArtifact | None
    trained: stages.TrainArtifact | None
    exported: stages.ExportArtifact | None
    trained_eval: stages.EvalArtifact | None

    @property
    def headline(self) -> stages.EvalArtifact:
        """The run's result: the trained checkpoint's evaluation when there is one, else the base model's."""
        return self.trained_eval or self.base_eval


def _record(cfg: ExperimentConfig, run: _Run, ev: _Evals, progress: Progress, t0: float) -> dict[str, Any]:
    # Base vs trained on the same problems, paired (rlvr_core.eval.compare): the delta's interval is much tighter
    # than two independent accuracies' would be, and the solvable sets show whether RL widened or sharpened.
    comparison = None
    if ev.base_eval and ev.trained_eval:
        comparison = compare(from_tables(ev.base_eval.samples, ev.base_eval.metrics, "base", "base"),
                             from_tables(ev.trained_eval.samples, ev.trained_eval.metrics, "trained", "trained"))
        benchmark = ev.base_eval.summary["benchmark"]
        flag = regression_flag(_comparison_summary(comparison, benchmark)["accuracy_greedy"], benchmark)
        if flag:  # with the evaluation's own flags: summary, report, warehouse health_events, the CLI's WARNING
            ev.trained_eval.summary["flags"] = [*(ev.trained_eval.summary.get("flags") or []), flag]
            progress("compare", f"flag {flag['reason']}")
    summary = _summary(cfg, run, ev, comparison, t0)
    with tempfile.TemporaryDirectory(prefix="rlvr-attach-") as tmp:
        folders = {}
        if comparison:
            write_report(comparison, Path(tmp) / "comparison")  # comparison.md / .json beside the evaluations
            folders["."] = Path(tmp) / "comparison"
        if ev.base_eval and ev.trained_eval:
            summary["probe"] = _probe_report(cfg, ev, Path(tmp) / "probe", run.run_id)
            folders["probe"] = Path(tmp) / "probe"
        report_md = _report(cfg, summary)
        counts = t.record(
            run.store, run.prefix, run.tracker, run.run_id, run=_run_row(cfg, run, ev, t0), params=_params(run),
            manifest=_manifest(cfg, run, ev), config=run.public, summary=summary, tables=_tables(cfg, ev),
            metrics=_metrics(ev), tags=_tags(run, ev, summary), texts={"report.md": report_md}, folders=folders)
    progress("record", f"artifacts at {run.store.url(run.prefix)} "
                       f"(index: {run.store.url(join(run.prefix, 'index.html'))})")
    progress("warehouse", f"ingested {sum(counts.values())} rows into {settings.warehouse_path()}")
    summary["warehouse_rows"] = counts
    _publish(summary, report_md, run)
    return summary


def _params(run: _Run) -> dict[str, Any]:
    sweep = run.sweep
    return {**config_params(run.public),
            **({"sweep.id": sweep["sweep_id"], "sweep.trial_id": sweep["trial_id"],
                "sweep.trial_label": sweep["trial_label"]} if sweep["sweep_id"] else {})}


def _summary(cfg: ExperimentConfig, run: _Run, ev: _Evals, comparison, t0: float) -> dict[str, Any]:
    """The numbers `rlvr demo` prints and summary.json holds. `accuracy_greedy`, `passk`: the run's result
    (the trained checkpoint when there is one); `base_*` / `trained_*` / `delta_pass_at_1`: each side."""
    head, base, trained = ev.headline, ev.base_eval, ev.trained_eval
    return {
        "mlflow_run_id": run.run_id, "experiment": cfg.tracking.experiment, "kind": run.kind, **run.sweep,
        "accuracy_greedy": head.summary["accuracy_greedy"], "accuracy_greedy_ci95": head.summary["accuracy_greedy_ci"],
        "n_eval": head.summary["n"], "passk": head.summary["passk"],
        **({"base_pass_at_1": base.summary["accuracy_greedy"], "base_pass_at_1_ci95": base.summary["accuracy_greedy_ci"],
            "base_pass_at_k": base.summary["passk"], "base_accuracy_greedy": base.summary["accuracy_greedy"]}
           if base else {}),
        **({"trained_pass_at_1": trained.summary["accuracy_greedy"],
            "trained_pass_at_1_ci95": trained.summary["accuracy_greedy_ci"], "trained_pass_at_k": trained.summary["passk"]}
           if trained else {}),
        **({"delta_pass_at_1": trained.summary["accuracy_greedy"] - base.summary["accuracy_greedy"]}
           if base and trained else {}),
        **({"train": {k: v for k, v in ev.trained.summary.items() if not isinstance(v, (list, dict))}}
           if ev.trained else {}),
        **({"export": {"uri": ev.exported.uri, "step": ev.exported.step, "dtype": ev.exported.dtype,
                       "manifest_sha256": ev.exported.manifest_sha256}} if ev.exported else {}),
        **({"comparison": _comparison_summary(comparison, base.summary["benchmark"])} if comparison else {}),
        "eval": {k: v for k, v in (base or head).summary.items() if k != "passk"},
        **({"trained_eval": {k: v for k, v in trained.summary.items() if k != "passk"}} if trained else {}),
        # Every evaluation over a limit (G-verifier-error, G-truncation), the evaluation named.
        "eval_flags": [{"eval_id": name, **f} for name, e in (("base", base), ("trained", trained)) if e
                       for f in e.summary.get("flags") or []],
        "pass_rates": ev.passrates.summary, "pass_rate_table_id": ev.passrates.table_id,
        "curriculum_id": ev.curriculum.curriculum_id,
        "curriculum": {"id": ev.curriculum.curriculum_id, "strategy": cfg.curriculum.strategy,
                       "n_prompts": ev.curriculum.n_prompts},
        "cached": {"data": ev.data.cached, "base_model": ev.model.cached, "pass_rate_table": ev.passrates.cached,
                   "curriculum": ev.curriculum.cached, **({"train": ev.trained.cached} if ev.trained else {})},
        "guard_coverage": guard_coverage(cfg),  # every guard: active, or the setting it needs (docs/guards.md)
        "numerics": numerics(),  # thread count and CPU instruction set: with the seed, they fix the numbers
        "config_hash": run.config_hash, "mlflow_child_run_ids": run.children,
        "mlflow_experiment_id": run.tracker.experiment_id, "mlflow_tracking_uri": run.tracker.display_uri,
        "mlflow_run_url": run.tracker.run_url(run.run_id), "prefect_flow_run_id": run.prefect_id,
        "artifact_uri": run.store.url(run.prefix), "warehouse_path": str(settings.warehouse_path()),
        "duration_s": round(time.monotonic() - t0, 2),
    }


def _record_stopped(cfg: ExperimentConfig, run: _Run, ev: _Evals, progress: Progress,
                    t0: float) -> dict[str, Any] | None:
    """A serious guard stopped training (G-collapse, G-entropy, G-kl-explosion): record what the run has (its
    steps, health events, the trainer's summary, the base evaluation if any) under the `collapsed` tag with
    status FAILED, so that the warehouse's collapsed runs, the report and the MLflow run say why it stopped.
    Nothing is exported: the trainer kept no checkpoint of the bad state. Any other failure records nothing
    here (the flow run and the MLflow run fail with it). Returns the stopped run's summary, None when training
    was not stopped by a guard."""
    stopped = stages.stopped_training(cfg, ev.model, ev.curriculum)
    if stopped is None:
        return None
    folder, train_summary = stopped
    trained = stages.TrainArtifact(ev.model, str(folder / STEPS_FILE), str(folder), False, train_summary)
    summary = {"mlflow_run_id": run.run_id, "experiment": cfg.tracking.experiment, "kind": run.kind, **run.sweep,
               "status": "collapsed", "stopped_at_step": train_summary.get("stopped_at_step"),
               "stopped_by": train_summary.get("stopped_by"), "health_firings": train_summary.get("health_firings"),
               "train": {k: v for k, v in train_summary.items() if not isinstance(v, (list, dict))},
               "config_hash": run.config_hash, "artifact_uri": run.store.url(run.prefix),
               "mlflow_run_url": run.tracker.run_url(run.run_id), "duration_s": round(time.monotonic() - t0, 2)}
    row = {**_run_row(cfg, run, ev, t0), "status": "FAILED",
           "tags": {"collapsed": "true", "stopped_at_step": str(summary["stopped_at_step"])}}
    tables = {**stages.record_tables(cfg, ev.model, ev.passrates, ev.curriculum), **_train_tables(trained),
              "train/health_events.parquet": warehouse.health_events_table(
                  (train_summary.get("health_firings") or []) + _eval_events(ev))}
    if ev.base_eval:
        tables.update({"evals/samples.parquet": ev.base_eval.samples, "evals/metrics.parquet": ev.base_eval.metrics,
                       "passk_curves.parquet": ev.base_eval.curves})
    reasons = "; ".join(f["reason"] for f in train_summary.get("health_firings") or [] if f.get("serious"))
    report_md = (f"# Pipeline run `{run.run_id}`: stopped by a guard at step {summary['stopped_at_step']}\n\n"
                 f"{reasons}\n\nNo checkpoint was exported. Artifacts: {summary['artifact_uri']}\n")
    t.record(run.store, run.prefix, run.tracker, run.run_id, run=row, params=_params(run),
             manifest=_manifest(cfg, run, ev), config=run.public, summary=summary, tables=tables,
             metrics=_eval_metrics(ev.base_eval) if ev.base_eval else {},
             tags={"collapsed": "true", "stopped_at_step": str(summary["stopped_at_step"]),
                   "artifact_uri": summary["artifact_uri"]}, texts={"report.md": report_md})
    progress("record", f"training stopped by a guard at step {summary['stopped_at_step']} ({reasons}); "
                       f"recorded at {run.store.url(run.prefix)}")
    return {**summary, "reasons": reasons, "report": run.store.url(f"{run.prefix}/report.md"),
            "train_folder": str(folder)}


def _run_row(cfg: ExperimentConfig, run: _Run, ev: _Evals, t0: float) -> dict[str, Any]:
    """The warehouse `runs` row; its `tags` become `run_tags` (`collapsed` is what collapsed_runs looks for)."""
    final = ev.exported.model if ev.exported else ev.model
    return {"run_id": run.run_id, "experiment": cfg.tracking.experiment, "name": run.name, "kind": run.kind,
            "status": "FINISHED", "started_at": run.started,
            "finished_at": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "duration_s": time.monotonic() - t0,
            "config_hash": run.config_hash, "git_sha": run.git["sha"], "git_dirty": run.git["dirty"],
            "model_id": final.model_id, "model_hash": final.model_hash, "tokenizer_hash": ev.model.tokenizer_hash,
            "dataset_hash": ev.data.dataset_hash, "prompt_template": run.template_key,
            "artifact_uri": run.store.url(run.prefix), "mlflow_run_id": run.run_id,
            "prefect_flow_run_id": run.prefect_id,
            **({"tags": {"collapsed": "true"}} if ev.trained and _collapsed(ev.trained.summary) else {})}


def _manifest(cfg: ExperimentConfig, run: _Run, ev: _Evals) -> dict[str, Any]:
    trained, exported = ev.trained, ev.exported
    return stages.experiment_manifest(
        cfg, ev.data, ev.model, config_hash=run.config_hash, resolved_config=run.public,
        template_key=run.template_key,
        extra={"mlflow_run_id": run.run_id, "mlflow_child_run_ids": run.children, "prefect_flow_run_id": run.prefect_id,
               **run.sweep, "pass_rate_table_id": ev.passrates.table_id, "curriculum_id": ev.curriculum.curriculum_id,
               "trained_model": ({"id": trained.model.model_id, "hash": trained.model.model_hash,
                                  "path": trained.model.path} if trained else None),
               "export": ({"uri": exported.uri, "step": exported.step, "dtype": exported.dtype,
                           "manifest_sha256": exported.manifest_sha256,
                           "model_hash": exported.model.model_hash} if exported else None)})


def _tables(cfg: ExperimentConfig, ev: _Evals) -> dict[str, pa.Table]:
    evals = [e for e in (ev.base_eval, ev.trained_eval) if e is not None]
    # "default" promotion: a column that is all-null in one eval (e.g. no extracted answers) still concatenates.
    # The curves are the evaluator's own: pass@k for every k = 1..n, per scoring, with eval_id, benchmark,
    # checkpoint and scoring as columns (warehouse `passk_curves`), so they match `rlvr eval`'s file.
    tables = {**stages.record_tables(cfg, ev.model, ev.passrates, ev.curriculum),
              "evals/samples.parquet": pa.concat_tables([e.samples for e in evals], promote_options="default"),
              "evals/metrics.parquet": pa.concat_tables([e.metrics for e in evals], promote_options="default"),
              "passk_curves.parquet": pa.concat_tables([e.curves for e in evals])}
    if ev.trained:
        tables.update(_train_tables(ev.trained))
    events = _eval_events(ev)
    if ev.trained or events:
        # Written even when nothing fired: an empty file says "no firings", whereas a missing one makes the
        # warehouse fall back to the per-step health/* flags. Training's firings and episodes, then the
        # evaluations' flags.
        firings = (ev.trained.summary.get("health_firings") or []) if ev.trained else []
        tables["train/health_events.parquet"] = warehouse.health_events_table(firings + events)
    return tables


def _eval_events(ev: _Evals) -> list[dict[str, Any]]:
    """Health events of the evaluations' flags: the base model's at step 0, the trained checkpoint's at the
    step it was exported at."""
    out = []
    if ev.base_eval:
        out += warehouse.eval_flag_events(ev.base_eval.summary.get("flags") or [], 0, "base")
    if ev.trained_eval:
        out += warehouse.eval_flag_events(ev.trained_eval.summary.get("flags") or [], ev.exported.step, "trained")
    return out


def _train_tables(trained: stages.TrainArtifact) -> dict[str, pa.Table]:
    """The training stage's files in the run folder (docs/warehouse.md says which table each fills);
    train/health_events.parquet comes from `_tables`."""
    tables = {"train/steps.parquet": pq.read_table(trained.steps_path),
              "train/steps_long.parquet": stages.steps_long(trained.steps_path)}
    rollouts = Path(trained.folder) / ROLLOUTS_FILE  # absent with grpo.rollout_samples_per_step = 0
    if rollouts.is_file():
        tables["train/rollouts.parquet"] = pq.read_table(rollouts)
    return tables


def _metrics(ev: _Evals) -> dict[str, float]:
    """The parent run's headline numbers (runs compare at the top level of the MLflow UI); each stage's
    child run holds its detail. `eval/<benchmark>/…`: the base model when the run evaluated it, else the
    trained checkpoint; `eval/<benchmark>/trained/…`: the trained checkpoint."""
    first = ev.base_eval or ev.trained_eval
    metrics = {**_eval_metrics(first), **_passk_metrics(ev.passrates), "curriculum/n_prompts": ev.curriculum.n_prompts}
    if ev.trained_eval:
        metrics.update(_eval_metrics(ev.trained_eval, "trained"))
    return metrics


def _tags(run: _Run, ev: _Evals, summary: dict[str, Any]) -> dict[str, Any]:
    exported = ev.exported
    return {"dataset_hash": ev.data.dataset_hash, "model_hash": ev.model.model_hash,
            "artifact_uri": summary["artifact_uri"],
            **({"export_uri": exported.uri, "export_step": str(exported.step),
                "export_manifest_sha256": exported.manifest_sha256} if exported else {})}


def _eval_metrics(ev: stages.EvalArtifact, sub: str | None = None) -> dict[str, float]:
    """An evaluation's numbers under `eval/<benchmark>[/<sub>]/…` (pass@k stored as pass@k)."""
    ns = f"eval/{ev.summary['benchmark']}" + (f"/{sub}" if sub else "")
    return {f"{ns}/accuracy_greedy": ev.summary["accuracy_greedy"], f"{ns}/n": ev.summary["n"],
            **{f"{ns}/pass@{k}": v for k, v in ev.curve.items()},
            **{f"{ns}/{k}": v for k, v in ev.summary.items() if k.endswith("_share")}}


def _passk_metrics(passrates: stages.PassRateArtifact) -> dict[str, float]:
    return {f"passk/{k}": float(v) for k, v in passrates.summary.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _probe_report(cfg: ExperimentConfig, ev: _Evals, out: Path, run_id: str) -> dict[str, Any]:
    """A short RL-Probe report (docs/probes.md) of the trained checkpoint against the base on the held-out
    problems the base failed and the trained model solved: token KL, spikes and their categories. It reuses
    the two evaluations' greedy completions (nothing is sampled again); its tables go to the warehouse with
    the run (`probe/`)."""
    probe = ProbeSettings(max_problems=50, sample_figures=2, task=TaskSettings(
        template_id=cfg.prompt.template, verifier=cfg.eval.verifier, verifier_mode=cfg.eval.verifier_mode,
        max_new_tokens=cfg.eval.max_new_tokens, seed=cfg.sampling.seed))
    _, meta = run_rl_probe(Checkpoint("base", 0, ev.model.path),
                           [Checkpoint("trained", ev.exported.step, ev.exported.model.path)],
                           ev.data.test_rows(), out, probe, probe_id=f"{run_id}",
                           greedy_a=ev.base_eval.samples.to_pylist(), greedy_b=ev.trained_eval.samples.to_pylist())
    tokens = pq.read_table(out / "probe_tokens.parquet", columns=["checkpoint_b", "is_spike", "category"]).to_pylist()
    spikes = [r["category"] for r in tokens if r["checkpoint_b"] == "trained" and r["is_spike"]]
    by_cat = {c: spikes.count(c) for c in sorted(set(spikes))}
    keep = ("probe_id", "n_selected", "n_sequences", "n_tokens_per_checkpoint", "duration_s")
    return {"folder": "probe/", **{k: meta[k] for k in keep}, "spikes": len(spikes), "spikes_by_category": by_cat}


def _collapsed(train_summary: dict[str, Any]) -> bool:
    """Did a serious guard stop training? The trainer tags its summary `collapsed` then; a serious firing
    in the summary's health_firings says the same for summaries written without tags."""
    return ("collapsed" in (train_summary.get("tags") or [])
            or any(f.get("serious") for f in train_summary.get("health_firings") or []))


def _comparison_summary(cmp: dict[str, Any], benchmark: str) -> dict[str, Any]:
    """The headline part of `compare`'s result for the JSON summary (the whole of it is comparison.json)."""
    r = cmp["benchmarks"][benchmark]
    d = r["deltas"]
    a, b = cmp["a"]["label"], cmp["b"]["label"]
    return {
        "a": a, "b": b, "benchmark": benchmark, "scoring": r["scoring"],
        "n_problems": r["n_problems"],
        # B − A, paired over the same problems, with the 95% paired t interval (McNemar p for greedy).
        "accuracy_greedy": {k: d["accuracy_greedy"][k] for k in ("delta", "ci_low", "ci_high", "n", "mcnemar_p")}
        if "accuracy_greedy" in d else None,
        "pass_at_k": {m.removeprefix("pass@"): {k: v[k] for k in ("delta", "ci_low", "ci_high")}
                      for m, v in d.items() if m.startswith("pass@")},
        "solvable_overlap": r["solvable_overlap"],  # at least one of n samples correct: both / a_only / b_only / neither
        # Problems solved by one side only: greedily, and by at least one of the n samples ("ever").
        "solved_greedy_only": {a: len(r["solved_greedy"]["a_only"]), b: len(r["solved_greedy"]["b_only"])},
        "solved_ever_only": {a: len(r["solved_ever"]["a_only"]), b: len(r["solved_ever"]["b_only"])},
        "report": "comparison.md",
    }


# ------------------------------------------------------------------------------------------ report
def _report(cfg: ExperimentConfig, s: dict[str, Any]) -> str:
    lo, hi = s["accuracy_greedy_ci95"]
    lines = [f"# Pipeline run `{s['mlflow_run_id']}`" + (f" — trial {s['trial_id']} of `{s['sweep_id']}`"
                                                         if s.get("sweep_id") else ""), ""]
    if s.get("trial_label"):
        lines += [f"Trial: `{s['trial_label']}`", ""]
    lines += ["| metric | value |", "|---|---|",
              f"| held-out greedy accuracy | {s['accuracy_greedy']:.3f} (95% CI {lo:.3f}–{hi:.3f}, n = {s['n_eval']}) |"]
    if "base_accuracy_greedy" in s:
        lines.append(f"| base model greedy accuracy | {s['base_accuracy_greedy']:.3f} |")
    if s.get("comparison") and s["comparison"]["accuracy_greedy"]:
        d = s["comparison"]["accuracy_greedy"]
        lines.append(f"| trained − base, paired | {d['delta']:+.3f} (95% CI {d['ci_low']:+.3f} to {d['ci_high']:+.3f}) |")
    for k, v in s["passk"].items():
        lines.append(f"| pass@{k} | {v:.3f} |")
    if "train" in s:
        tr = s["train"]
        lines.append(f"| GRPO steps (resumed from step) | {tr.get('steps')} ({tr.get('resumed_from_step', 0)}) |")
        lines.append(f"| reward first → last step | {tr.get('first_reward_mean', float('nan')):.3f} → "
                     f"{tr.get('last_reward_mean', float('nan')):.3f} |")
    flags = [f"- **flag** {f['eval_id']} evaluation: {f['reason']}" for f in s.get("eval_flags") or []]
    lines += ["", *flags] if flags else []
    lines += _coverage_lines(s.get("guard_coverage") or {})
    lines += ["", f"- MLflow run: {s['mlflow_run_url']}", f"- Artifacts: {s['artifact_uri']}",
              f"- Config hash: `{s['config_hash']}`; experiment `{cfg.tracking.experiment}`"]
    if "export" in s:
        lines.append(f"- Checkpoint: {s['export']['uri']} (step {s['export']['step']})")
    return "\n".join(lines) + "\n"


def _coverage_lines(coverage: dict[str, str]) -> list[str]:
    """The report's guard coverage: how many guards are active, and each one that needs a setting."""
    needs = {g: v for g, v in coverage.items() if not v.startswith("active")}
    if not coverage:
        return []
    lines = ["", f"Guards (docs/guards.md): {len(coverage) - len(needs)} of {len(coverage)} active."]
    return lines + [f"- {g} {v}" for g, v in needs.items()]


def _publish(summary: dict[str, Any], report_md: str, run: _Run) -> None:
    """Prefect artifacts: the run's markdown summary and links to MLflow and the artifact store."""
    sweep_id, trial_id = run.sweep["sweep_id"], run.sweep["trial_id"]
    key = "pipeline-" + (f"{sweep_id}-{trial_id}" if sweep_id else run.run_id)
    key = "".join(c if c.isalnum() or c == "-" else "-" for c in key.lower())[:100]
    create_markdown_artifact(redact_text(report_md), key=key, description="pipeline run summary")
    create_link_artifact(summary["mlflow_run_url"], link_text=f"MLflow run {run.run_id}", key=key + "-mlflow")
    create_link_artifact(summary["artifact_uri"], link_text="artifact store folder", key=key + "-artifacts")
