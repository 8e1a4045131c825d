"""The `ablation-sweep` flow: a sweep file expands to trials; each trial is a `pipeline` flow run on the GPU
work pool; results aggregate into an MLflow parent run, a Prefect table artifact and a warehouse pivot.

    rlvr sweep run demo-lr --watch            (validates, submits, follows, prints the pivot: rlvr_cli/sweep.py)
    prefect deployment run 'ablation-sweep/demo-lr'
    prefect deployment run 'ablation-sweep/demo-lr' --param sweep=configs/sweeps/my_sweep.yaml

Order of work:
1. Load and expand the sweep (`rlvr_core.pipeline.sweeps`): every trial config is validated before anything runs.
2. Shared stages once: for each distinct (data, model, sampling, pass@k) setting, one `pipeline` run with
   `stop_after="curriculum"` builds the data, base model and pass-rate table; they are content-addressed
   (`rlvr_core.pipeline.cache`), so every trial finds them instead of recomputing (trials share the cache
   folder, or workers with their own `RLVR_HOME` share it through `RLVR_STAGE_STORE`: docs/orchestration.md).
3. Trials: `run_deployment("pipeline/…")` per trial, `max_parallel` at a time, each with the MLflow
   parent run id and its sweep/trial ids. A trial whose flow run crashed (its worker was lost: the
   heartbeat automation marks it Crashed) is launched again; the new run resumes from the checkpoint. Only a
   crashed run is launched again (`TRIAL_RETRY`): a trial that failed has had its stages' own retries.
4. Aggregate: the warehouse pivot (one row per cell, mean and a 95% interval across seeds), a Prefect
   table artifact `sweep-<id>` and link artifacts `sweep-<id>-mlflow` / `-artifacts` (what `rlvr sweep`
   prints), metrics and the pivot on the MLflow parent run.
A failure ends the flow with `SweepFailed: <one line>` (the final error, e.g. a ConfigError naming the file
and field, not a traceback) as its state message; the MLflow parent run gets the same line as tag `error`.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact
from prefect.deployments import run_deployment
from prefect.runtime import flow_run

from flows.pipeline import pipeline_flow
from flows.sealed import sealed_flow, sealed_parameters
from rlvr_core.artifacts import layout
from rlvr_core.artifacts.artifacts_index import publish_sweep_index
from rlvr_core.artifacts.layout import sweep_prefix
from rlvr_core.artifacts.storage import open_store
from rlvr_core.core import settings
from rlvr_core.experiment.config import config_hash
from rlvr_core.experiment.secrets import unseal
from rlvr_core.pipeline.sweeps import (Sweep, Trial, find_sweep, format_pivot, load_sweep,  # noqa: F401
                                       one_line_error, parse_sweep, pivot_metric_key, pivot_rows,
                                       sweep_pivot)  # sweep_pivot: re-exported
from rlvr_core.records import warehouse
from rlvr_core.records.tracking import RUN_NAME_ORDER, TRAINING_CURVES, Tracker, saved_view
from rlvr_core.pipeline.child.errors import DeterministicError
from rlvr_core.pipeline.child.run import ROOT
from tasks.retry import FlowRunCrashed, relaunch_condition_fn
from tasks.stages import RETRY

# The config sections that decide the shared stages (data → base model → pass-rate table → curriculum).
SHARED_SECTIONS = ("data", "model", "prompt", "sampling", "passk", "curriculum")
# Tasks that launch a pipeline flow run retry only a crashed run (a lost worker); the stages inside the run
# retry their own transient failures, so a failure is retried by one layer, never by both.
TRIAL_RETRY = {**RETRY, "retry_condition_fn": relaunch_condition_fn}


# ------------------------------------------------------------------------------------------ tasks
def _check_flow_run(fr: Any, what: str) -> None:
    state = fr.state
    if state is None or state.is_completed():
        return
    # One line: the child's final error (its state message), not the traceback in its logs.
    msg = f"{what} {state.type.value.lower()}: {one_line_error(state.message) or 'no message'} (flow run {fr.name})"
    if state.is_crashed():  # lost worker / killed process: launching it again resumes from its checkpoint
        raise FlowRunCrashed(msg)
    raise DeterministicError(msg)  # its stages already retried what was transient


# Named for what it runs, not Prefect's generated "shared-stages-db3".
@task(name="shared-stages", task_run_name="shared stages: data, base model, pass rates, curriculum", **TRIAL_RETRY)
def shared_stages(config: dict[str, Any], deployment: str | None, timeout_s: float) -> str:
    """Data → base model → pass-rate table → curriculum once, on the GPU pool (or inline without a deployment)."""
    if deployment is None:
        return pipeline_flow(config, stop_after="curriculum")["pass_rate_table_id"]
    fr = run_deployment(deployment, parameters=sealed_parameters({"config": config, "stop_after": "curriculum"}),
                        timeout=timeout_s, as_subflow=True)
    _check_flow_run(fr, "shared stages")
    return str(fr.id)


# Task runs named by their trial ("t03 lr=1e-05 seed=0"), as the MLflow runs are, not Prefect's "trial-54e".
@task(name="trial", task_run_name="{trial.trial_id} {trial.label}", **TRIAL_RETRY)
def run_trial(trial: Trial, sweep_id: str, parent_run_id: str, deployment: str | None, timeout_s: float) -> str:
    params = {"config": trial.config, "parent_run_id": parent_run_id, "sweep_id": sweep_id,
              "trial_id": trial.trial_id, "trial_label": trial.label}
    if deployment is None:  # inline (no server / worker): a subflow in this process

        return pipeline_flow(**params)["mlflow_run_id"]
    fr = run_deployment(deployment, parameters=sealed_parameters(params), timeout=timeout_s, as_subflow=True,
                        flow_run_name=f"{sweep_id}-{trial.trial_id}")
    _check_flow_run(fr, f"trial {trial.trial_id} ({trial.label})")
    return str(fr.id)


# ------------------------------------------------------------------------------------------ the flow
class SweepFailed(RuntimeError):
    """The sweep's final error in one line (the flow run's state message reads `SweepFailed: <line>`)."""


def _load(sweep: str | dict[str, Any], sweep_source: str | None) -> tuple[Sweep, str]:
    """A sweep name or path (the worker's checkout), or the mapping `rlvr sweep run` submits (base inlined)."""
    if isinstance(sweep, dict):
        source = sweep_source or f"<sweep {sweep.get('name', '?')}>"
        return parse_sweep(unseal(sweep, source, path="sweep"), source), source
    path = find_sweep(sweep)
    if not path.is_absolute() and not path.exists():
        path = ROOT / path
    return load_sweep(path), str(path)  # every trial validated; ConfigError names the file and field


@sealed_flow(name="ablation-sweep", log_prints=True, validate_parameters=False)
def ablation_sweep_flow(sweep: str | dict[str, Any] = "demo-lr", max_parallel: int = 2,
                        deployment: str | None = "pipeline/pipeline", trial_timeout_s: float = 6 * 3600,
                        sweep_source: str | None = None) -> dict[str, Any]:
    """`sweep`: a sweep name under configs/sweeps, a path, or the sweep itself (a mapping, as `rlvr sweep run`
    sends it; `sweep_source` names its file in messages). `deployment=None` runs trials inline (no worker)."""
    settings.configure_environment()
    try:
        sw, source = _load(sweep, sweep_source)
    except Exception as e:
        raise SweepFailed(one_line_error(f"{type(e).__name__}: {e}")) from e
    run_key = str(flow_run.id)[:8] if flow_run.id else time.strftime("%H%M%S")
    sweep_id = f"{sw.spec.name}-{run_key}"
    tracker = Tracker(sw.base_config["tracking"]["experiment"], sw.base_config["tracking"]["tracking_uri"])
    parent = tracker.start_run(layout.mlflow_run_name("sweep", sweep_id=sweep_id),
                               {"kind": "sweep", "sweep_id": sweep_id, "sweep_name": sw.spec.name,
                                "sweep_hash": sw.sweep_hash, "sweep_file": source,
                                "prefect_flow_run_id": str(flow_run.id) if flow_run.id else None})
    _save_sweep_view(sw, sweep_id, tracker)
    tracker.set_tags(parent, {NOTE_TAG: sweep_note(sw, sweep_id, tracker)})
    get_run_logger().info(f"sweep {sweep_id}: {len(sw.trials)} trials, MLflow parent run {parent}; its trials "
                          f"in MLflow: {tracker.view_url(sweep_view_id(sweep_id))}")
    try:
        out = _run_sweep(sw, sweep_id, parent, tracker, max_parallel, deployment, trial_timeout_s)
        tracker.end_run(parent, "FINISHED")
        return out
    except Exception as e:
        line = one_line_error(f"{type(e).__name__}: {e}")
        tracker.set_tags(parent, {"error": line[:5000]})  # the MLflow parent says why, as the flow run does
        tracker.end_run(parent, "FAILED")
        raise SweepFailed(line) from e
    except BaseException:
        tracker.end_run(parent, "FAILED")
        raise


def _run_sweep(sw: Sweep, sweep_id: str, parent: str, tracker: Tracker, max_parallel: int,
               deployment: str | None, trial_timeout_s: float) -> dict[str, Any]:
    log, t0 = get_run_logger(), time.monotonic()
    tracker.log_params(parent, {"sweep.trials": len(sw.trials), "sweep.seeds": sw.spec.seeds,
                                "sweep.metric": sw.spec.metric,
                                **{f"sweep.grid.{k}": v for k, v in sw.spec.grid.items()}})
    # 2. shared stages, once per distinct setting
    shared: dict[str, dict[str, Any]] = {}
    for tr in sw.trials:
        shared.setdefault(config_hash({s: tr.config[s] for s in SHARED_SECTIONS}), tr.config)
    for fut in [shared_stages.submit(c, deployment, trial_timeout_s) for c in shared.values()]:
        fut.result()
    log.info(f"shared stages ready ({len(shared)} distinct pass-rate settings for {len(sw.trials)} trials)")
    # 3. trials, max_parallel at a time (the GPU pool's slots are the real limit on a cluster)
    results: dict[str, str] = {}
    for i in range(0, len(sw.trials), max(1, max_parallel)):
        wave = sw.trials[i:i + max(1, max_parallel)]
        futures = [run_trial.submit(tr, sweep_id, parent, deployment, trial_timeout_s) for tr in wave]
        for tr, fut in zip(wave, futures):
            results[tr.trial_id] = fut.result()  # a trial that failed for good fails the sweep
    # 4. aggregate
    pivot = sweep_pivot(sweep_id, sw.swept_keys, sw.spec.metric)
    children = tracker.client.search_runs([tracker.experiment_id], f"tags.mlflow.parentRunId = '{parent}'")
    out = _aggregate(sw, sweep_id, parent, tracker, pivot, children)
    out["duration_s"] = round(time.monotonic() - t0, 2)
    return out


def sweep_view_id(sweep_id: str) -> str:
    return f"sweep-{sweep_id}"


def _save_sweep_view(sw: Sweep, sweep_id: str, tracker: Tracker) -> None:
    """The sweep's saved MLflow view: its trials (no stage runs) grouped by the swept params, so each chart draws a
    cell's mean over seeds; the pivot metric's chart first (a bar per cell: the pivot), then the training curves.
    The pivot metric is also the experiment's primary metric."""
    key = pivot_metric_key(sw)
    tracker.set_primary_metric(key)
    tracker.save_view(sweep_view_id(sweep_id), saved_view(
        f"sweep {sweep_id}: {sw.spec.metric}", n_runs=len(sw.trials), group_by=sw.swept_keys,
        search_filter=f"tags.sweep_id = '{sweep_id}' and tags.kind = 'trial'", order_by=RUN_NAME_ORDER,
        sections={f"Sweep pivot: {sw.spec.metric}": ("BAR", [key]),
                  "Training curves": ("LINE", list(TRAINING_CURVES))}))


NOTE_TAG = "mlflow.note.content"  # the run page's "Description" (Markdown)


def sweep_note(sw: Sweep, sweep_id: str, tracker: Tracker, children: list[Any] | None = None) -> str:
    """The parent run's description: the link to its view (the trials' charts, grouped by cell) first, what the
    sweep compares, and, once they ran, a link per trial. Every link opens in MLflow's model-training view.
    The view's link is the first line: MLflow 3.17 shows a description's first lines only, under a gradient that
    takes the clicks of what it covers until "Show more" is clicked (the link on the third line was not clickable)."""
    lines = [f"[Compare the trials: the sweep's view, its trials' charts, one group per cell]"
             f"({tracker.view_url(sweep_view_id(sweep_id))})", "",
             f"**Sweep `{sweep_id}`**: {len(sw.trials)} trials, {sw.spec.metric} by "
             f"{', '.join(sw.swept_keys) or 'trial'} over seeds {sw.spec.seeds}."]
    if children:
        lines += ["", "Trials:"] + [f"- [{c.data.tags.get('trial_id')} {c.data.tags.get('trial_label', '')}]"
                                    f"({tracker.run_url(c.info.run_id)})"
                                    for c in sorted(children, key=lambda c: c.data.tags.get("trial_id", ""))]
    return "\n".join(lines)


def ui_link(tracker: Tracker, run_id: str) -> str | None:
    """The run's page in the MLflow UI (`<server>/#/experiments/<id>/runs/<run id>`), or None for a file store."""
    url = tracker.run_url(run_id)
    if not url.startswith(("http://", "https://")):
        return None
    return url if "/#/" in url else url.replace("#/", "/#/", 1)


def sweep_location(sw: Sweep, sweep_id: str) -> str:
    """The sweep's folder in the artifact store its trials write to (`<experiment>/<sweep id>/`, rlvr_core.artifacts.layout)."""
    storage = sw.base_config["storage"]
    store = open_store(storage["artifact_uri"], storage.get("s3_endpoint_url"))
    return store.url(sweep_prefix(sw.base_config["tracking"]["experiment"], sweep_id)) + "/"


def pivot_log_line(sw: Sweep, sweep_id: str, pivot: list[dict[str, Any]], tracker: Tracker) -> str:
    """The sweep's result as its flow's last log line: the pivot table (as `rlvr sweep run --watch` prints it)
    and the comparison's link."""
    table = format_pivot(pivot_rows(pivot, sw.swept_keys), sw.swept_keys, sw.spec.metric)
    return (f"sweep {sweep_id} done: {sw.spec.metric} by {', '.join(sw.swept_keys) or 'trial'}\n{table}\n"
            f"MLflow compare view: {tracker.view_url(sweep_view_id(sweep_id))}")


def artifact_key(sweep_id: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes."""
    return "sweep-" + "".join(c if c.isalnum() else "-" for c in sweep_id.lower())


def _aggregate(sw: Sweep, sweep_id: str, parent: str, tracker: Tracker, pivot: list[dict[str, Any]],
               children: list[Any]) -> dict[str, Any]:
    metric = sw.spec.metric
    key = artifact_key(sweep_id)
    # Read back by `rlvr sweep run --watch` / `status` (flows/sweep_cli.py): keep the row fields as pivot_rows makes them.
    create_table_artifact(pivot_rows(pivot, sw.swept_keys), key=key,
                          description=f"{sw.spec.name}: mean {metric} by cell, 95% CI across seeds (Student t); "
                                      f"swept: {', '.join(sw.swept_keys)}")
    create_link_artifact(ui_link(tracker, parent) or tracker.run_url(parent), link_text=f"MLflow parent run {parent}",
                         key=key + "-mlflow", description=f"MLflow parent run of {sweep_id} (experiment {tracker.experiment_id})")
    if children:  # MLflow's runs page in the sweep's saved view: its trials, the pivot metric's chart first
        create_link_artifact(tracker.view_url(sweep_view_id(sweep_id)), key=key + "-compare",
                             link_text="MLflow compare view of the trials", description=f"the trials of {sweep_id}")
    create_link_artifact(sweep_location(sw, sweep_id), link_text="the sweep's folder in the artifact store",
                         key=key + "-artifacts", description=f"index.html, pivot and one folder per trial of {sweep_id}")
    links = "\n".join(f"- {c.data.tags.get('trial_id')} `{c.data.tags.get('trial_label')}`: "
                      f"{tracker.run_url(c.info.run_id)}" for c in sorted(children, key=lambda c: c.data.tags.get('trial_id', '')))
    create_markdown_artifact(f"# Sweep `{sweep_id}`\n\nMLflow parent run: {tracker.run_url(parent)}\n\n"
                             f"Trials:\n{links}\n\nWarehouse pivot: `flows.ablation_sweep.sweep_pivot('{sweep_id}', "
                             f"{sw.swept_keys!r})`\n", key=key + "-links", description="links to the MLflow runs")
    tracker.set_tags(parent, {NOTE_TAG: sweep_note(sw, sweep_id, tracker, children)})
    best = max(pivot, key=lambda r: r["mean"]) if pivot else None
    # Rounded to 4 decimals: the parent's page showed 17 digits (0.44333333333333336); the pivot keeps them all.
    best_mean = round(best["mean"], 4) if best else float("nan")
    tracker.log_metrics(parent, {f"sweep/best_mean_{metric.replace('@', '_at_')}": best_mean,
                                 "sweep/cells": len(pivot), "sweep/trials": len(children)})

    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "pivot.json"
        p.write_text(json.dumps(pivot, indent=2, default=str))
        tracker.log_artifact(parent, p)
    # The sweep's folder in the artifact store: index.html (pivot, figure, a link per trial) and pivot.json.

    print("sweep index: " + publish_sweep_index(
        sw.base_config, sweep_id, pivot, sw.swept_keys, metric,
        {"MLflow parent run": tracker.run_url(parent),
         "MLflow compare view of the trials": tracker.view_url(sweep_view_id(sweep_id)),
         "MLflow parallel coordinates of the trials": tracker.compare_url([c.info.run_id for c in children])}
        if tracker.tracking_uri.startswith("http") else None))
    # The flow's last log line: the pivot, so `prefect deployment run 'ablation-sweep/…' --watch` ends with it.
    print(pivot_log_line(sw, sweep_id, pivot, tracker))
    return {"sweep_id": sweep_id, "mlflow_parent_run_id": parent, "n_trials": len(sw.trials),
            "n_child_runs": len(children), "pivot": pivot, "swept_keys": sw.swept_keys,
            "best": {k: best[k] for k in sw.swept_keys} if best else None}
