"""The `pipeline` flow: one experiment config through pass@k filter → curriculum → GRPO training → export →
evaluation → warehouse ingest → report.

    prefect deployment run 'pipeline/pipeline' --param config=configs/demo.yaml \
        --param overrides='{"grpo.enabled": true, "grpo.steps": 20}'

`ablation-sweep` launches it once per trial (its own flow run on the GPU work pool) with the resolved
trial config, the MLflow parent run id and the sweep/trial ids. A trial that is launched again (its worker
was lost) reuses its MLflow run and artifact prefix, the cached stages, and the training checkpoints,
so it resumes where it stopped and writes its warehouse rows once. `stop_after="curriculum"` runs only
the shared stages (the sweep uses it to compute the pass-rate table once for all trials).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from prefect import flow
from prefect.artifacts import create_link_artifact, create_markdown_artifact
from prefect.runtime import flow_run

from rlvr_core.artifacts import layout
from rlvr_core.artifacts.storage import join, open_store
from rlvr_core.core import manifest as manifest_mod
from rlvr_core.core import settings
from rlvr_core.core.progress import Progress
from rlvr_core.data.templates import get_template
from rlvr_core.experiment.config import ExperimentConfig, apply_overrides, dump_yaml, load_config, parse_config
from rlvr_core.pipeline import stages
from rlvr_core.pipeline.stages import experiment_manifest, steps_long
from rlvr_core.records.tracking import Tracker, flatten
from tasks import pipeline as tp
from tasks import stages as t

STOP_AFTER = ("curriculum", "evaluate", None)


def resolve_config(config: dict[str, Any] | str, overrides: dict[str, Any] | None = None) -> ExperimentConfig:
    """A path (relative to the project root when not found from the cwd) or a mapping, plus dotted overrides."""
    if isinstance(config, str):
        p = Path(config)
        if not p.is_absolute() and not p.exists():
            p = tp.ROOT / p
        return load_config(p, overrides)

    return parse_config(apply_overrides(config, overrides or {}), "<pipeline parameter config>")


@flow(name="pipeline", log_prints=True, validate_parameters=False)
def pipeline_flow(config: dict[str, Any] | str = "configs/demo.yaml", overrides: dict[str, Any] | None = None,
                  parent_run_id: str | None = None, sweep_id: str | None = None, trial_id: str | None = None,
                  trial_label: str | None = None, eval_base: bool = False,
                  stop_after: str | None = None) -> dict[str, Any]:
    if stop_after not in STOP_AFTER:
        raise ValueError(f"stop_after must be one of {STOP_AFTER}, got {stop_after!r}")
    settings.configure_environment()
    t0 = time.monotonic()
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    cfg = resolve_config(config, overrides)  # ConfigError (file + field) before any work
    progress = Progress(True)
    data = t.make_data(cfg, progress)
    model = t.warm_start_base(cfg, data, progress)
    passrates = t.pass_rate_table(cfg, data, model, progress)
    curriculum = t.build_curriculum(cfg, data, passrates, progress)
    if stop_after == "curriculum":
        return {"pass_rate_table_id": passrates.table_id, "curriculum_id": curriculum.curriculum_id,
                "cached": {"pass_rate_table": passrates.cached, "curriculum": curriculum.cached},
                "duration_s": round(time.monotonic() - t0, 2)}

    chash = cfg.config_hash()
    template = get_template(cfg.prompt.template)
    store = open_store(cfg.storage.artifact_uri, cfg.storage.s3_endpoint_url)
    git = manifest_mod.git_state()
    prefect_id = str(flow_run.id) if flow_run.id else None
    kind = "trial" if sweep_id else "pipeline"
    tags = {"config_hash": chash, "git_sha": git["sha"], "git_dirty": git["dirty"], "prefect_flow_run_id": prefect_id,
            "kind": kind, "prompt_template": template.key, "sweep_id": sweep_id, "trial_id": trial_id,
            "trial_label": trial_label}
    tracking_uri = settings.mlflow_tracking_uri(cfg.tracking.tracking_uri)
    run_name = layout.mlflow_run_name(kind, name=cfg.name, sweep_id=sweep_id, trial_id=trial_id,
                                      trial_label=trial_label)
    run_id = tp.open_run(cfg.tracking.experiment, tracking_uri, run_name, tags, parent_run_id)
    # <experiment>/<sweep>/<trial>/ for a trial, <experiment>/<name>-<run id[:8]>/ otherwise (rlvr_core.artifacts.layout)
    prefix = layout.pipeline_prefix(cfg.tracking.experiment, cfg.name, run_id, sweep_id, trial_id, trial_label)

    tracker = Tracker(cfg.tracking.experiment, tracking_uri)
    try:
        trained = exported = trained_eval = base_eval = None
        if cfg.grpo.enabled:
            trained = tp.train(cfg, data, model, curriculum, mlflow_run_id=run_id)  # per-step metrics live
            exported = t.export(trained, model, store, join(prefix, "checkpoints", "final"),
                                {"config_hash": chash, "mlflow_run_id": run_id, "git_sha": git["sha"],
                                 "experiment": cfg.tracking.experiment, "sweep_id": sweep_id, "trial_id": trial_id},
                                progress)
            trained_eval = tp.evaluate(cfg, data, exported.model, "trained", exported.uri)
        if eval_base or not cfg.grpo.enabled:
            base_eval = tp.evaluate(cfg, data, model, "base", "base")
        evals = [e for e in (base_eval, trained_eval) if e is not None]
        headline = trained_eval or base_eval
        duration = time.monotonic() - t0
        summary = {
            "mlflow_run_id": run_id, "experiment": cfg.tracking.experiment, "kind": kind,
            "sweep_id": sweep_id, "trial_id": trial_id, "trial_label": trial_label,
            "accuracy_greedy": headline.summary["accuracy_greedy"],
            "accuracy_greedy_ci95": headline.summary["accuracy_greedy_ci"], "n_eval": headline.summary["n"],
            "passk": headline.summary["passk"],
            **({"base_accuracy_greedy": base_eval.summary["accuracy_greedy"]} if base_eval else {}),
            **({"train": {k: v for k, v in trained.summary.items() if not isinstance(v, (list, dict))}}
               if trained else {}),
            **({"export": {"uri": exported.uri, "step": exported.step,
                           "manifest_sha256": exported.manifest_sha256}} if exported else {}),
            "pass_rate_table_id": passrates.table_id, "curriculum_id": curriculum.curriculum_id,
            "cached": {"data": data.cached, "base_model": model.cached, "pass_rate_table": passrates.cached,
                       "curriculum": curriculum.cached, "train": trained.cached if trained else None},
            "config_hash": chash, "mlflow_tracking_uri": tracker.display_uri, "mlflow_run_url": tracker.run_url(run_id),
            "prefect_flow_run_id": prefect_id, "artifact_uri": store.url(prefix),
            "warehouse_path": str(settings.warehouse_path()), "duration_s": round(duration, 2),
        }
        params = {**flatten(cfg.resolved()), **({"sweep.id": sweep_id, "sweep.trial_id": trial_id,
                                                  "sweep.trial_label": trial_label} if sweep_id else {})}
        run_row = {"run_id": run_id, "experiment": cfg.tracking.experiment, "name": run_name, "kind": kind,
                   "status": "FINISHED", "started_at": started,
                   "finished_at": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "duration_s": duration,
                   "config_hash": chash, "git_sha": git["sha"], "git_dirty": git["dirty"],
                   "model_id": (exported.model if exported else model).model_id,
                   "model_hash": (exported.model if exported else model).model_hash,
                   "tokenizer_hash": model.tokenizer_hash, "dataset_hash": data.dataset_hash,
                   "prompt_template": template.key, "artifact_uri": store.url(prefix), "mlflow_run_id": run_id,
                   "prefect_flow_run_id": prefect_id}
        man = experiment_manifest(
            cfg, data, model, config_hash=chash, resolved_config=cfg.resolved(), template_key=template.key,
            extra={"mlflow_run_id": run_id, "prefect_flow_run_id": prefect_id, "sweep_id": sweep_id,
                   "trial_id": trial_id, "pass_rate_table_id": passrates.table_id,
                   "curriculum_id": curriculum.curriculum_id, "export": summary.get("export")})
        run_tables = stages.record_tables(cfg, model, passrates, curriculum)
        eval_names = [("base", base_eval), ("trained", trained_eval)]
        tables = {
            **run_tables,
            "passk_curves.parquet": pa.Table.from_pylist(
                [{"source": f"eval/{n}", "k": k, "value": v, "n_problems": e.summary["n"]}
                 for n, e in eval_names if e for k, v in e.curve.items()]),
            "evals/samples.parquet": pa.concat_tables([e.samples for e in evals], promote_options="default"),
            "evals/metrics.parquet": pa.concat_tables([e.metrics for e in evals], promote_options="default"),
            **({"train/steps.parquet": pq.read_table(trained.steps_path),
                "train/steps_long.parquet": steps_long(trained.steps_path)} if trained else {}),
        }
        metrics = {f"eval/synthetic/{n}/accuracy_greedy": e.summary["accuracy_greedy"] for n, e in eval_names if e}
        metrics.update({f"eval/synthetic/{n}/pass_at_{k}": v for n, e in eval_names if e for k, v in e.curve.items()})
        metrics["eval/synthetic/accuracy_greedy"] = headline.summary["accuracy_greedy"]
        metrics.update({f"passk/{k.replace('@', '_at_')}": float(v) for k, v in passrates.summary.items()
                        if isinstance(v, (int, float))})
        report_md = _report(cfg, summary)
        tp.record(store, prefix, (cfg.tracking.experiment, tracking_uri), run_id, run_row=run_row, params=params,
                  manifest=man, config_yaml=dump_yaml(cfg), summary=summary, tables=tables, metrics=metrics,
                  tags={"dataset_hash": data.dataset_hash, "model_hash": model.model_hash,
                        "artifact_uri": store.url(prefix),
                        **({"export_uri": exported.uri, "export_step": str(exported.step)} if exported else {})},
                  report_md=report_md, steps_path=trained.steps_path if trained else None)
        counts = t.ingest(store, prefix)
        summary["warehouse_rows"] = counts
        _publish(summary, report_md, run_id, sweep_id, trial_id)
        tracker.end_run(run_id, "FINISHED")
        summary["duration_s"] = round(time.monotonic() - t0, 2)
        return summary
    except BaseException:
        # A failed stage fails the flow (the exception propagates); the MLflow run says so too.
        try:
            tracker.end_run(run_id, "FAILED")
        except Exception:  # noqa: BLE001 - the tracking server being down must not hide the real error
            pass
        raise


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
    for k, v in s["passk"].items():
        lines.append(f"| pass@{k} | {v:.3f} |")
    if "train" in s:
        tr = s["train"]
        lines.append(f"| GRPO steps (resumed from step) | {tr.get('steps')} ({tr.get('resumed_from_step', 0)}) |")
        lines.append(f"| reward first → last step | {tr.get('first_reward_mean', float('nan')):.3f} → "
                     f"{tr.get('last_reward_mean', float('nan')):.3f} |")
    lines += ["", f"- MLflow run: {s['mlflow_run_url']}", f"- Artifacts: {s['artifact_uri']}",
              f"- Config hash: `{s['config_hash']}`; experiment `{cfg.tracking.experiment}`"]
    if "export" in s:
        lines.append(f"- Checkpoint: {s['export']['uri']} (step {s['export']['step']})")
    return "\n".join(lines) + "\n"


def _publish(summary: dict[str, Any], report_md: str, run_id: str, sweep_id: str | None, trial_id: str | None) -> None:
    """Prefect artifacts: the run's markdown summary and links to MLflow and the artifact store."""
    key = "pipeline-" + (f"{sweep_id}-{trial_id}" if sweep_id else run_id)
    key = "".join(c if c.isalnum() or c == "-" else "-" for c in key.lower())[:100]
    create_markdown_artifact(report_md, key=key, description="pipeline run summary")
    create_link_artifact(summary["mlflow_run_url"], link_text=f"MLflow run {run_id}", key=key + "-mlflow")
    create_link_artifact(summary["artifact_uri"], link_text="artifact store folder", key=key + "-artifacts")
