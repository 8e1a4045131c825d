"""The `ablation-sweep` flow: a sweep file expands to trials; each trial is a `pipeline` flow run on the GPU
work pool; results aggregate into an MLflow parent run, a Prefect table artifact and a warehouse pivot.

    prefect deployment run 'ablation-sweep/demo-2x2'
    prefect deployment run 'ablation-sweep/demo-2x2' --param sweep=configs/sweeps/my_sweep.yaml

Order of work:
1. Load and expand the sweep (`rlvr_core.sweeps`): every trial config is validated before anything runs.
2. Shared stages once: for each distinct (data, model, sampling, pass@k) setting, one `pipeline` run with
   `stop_after="curriculum"` builds the data, base model and pass-rate table; they are content-addressed
   (`rlvr_core.cache`), so every trial finds them instead of recomputing (trials must share the cache
   folder: one machine, or `RLVR_HOME` on shared storage).
3. Trials: `run_deployment("pipeline/…")` per trial, `max_parallel` at a time, each with the MLflow
   parent run id and its sweep/trial ids. A trial whose flow run crashed (its worker was lost: the
   heartbeat automation marks it Crashed) is launched again; the new run resumes from the checkpoint.
4. Aggregate: the warehouse pivot (one row per cell, mean and a 95% interval across seeds), a Prefect
   table artifact, metrics and the pivot on the MLflow parent run.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.deployments import run_deployment
from prefect.runtime import flow_run

from rlvr_core import settings, warehouse
from rlvr_core.config import config_hash
from rlvr_core.sweeps import Sweep, Trial, find_sweep, load_sweep
from rlvr_core.tracking import Tracker
from tasks.retry import DeterministicError, TransientError, retry_condition_fn

# The config sections that decide the shared stages (data → base model → pass-rate table → curriculum).
SHARED_SECTIONS = ("data", "model", "prompt", "sampling", "passk", "curriculum")


# ------------------------------------------------------------------------------------------ pivot (SQL)
def pivot_sql(swept_keys: list[str]) -> str:
    """One row per cell of the sweep: the swept values, seeds, and the metric per seed (warehouse only)."""
    cols = ",\n       ".join(f"max(CASE WHEN p.key = '{k}' THEN p.value END) AS \"{k}\"" for k in swept_keys)
    group = ", ".join(f'"{k}"' for k in swept_keys)
    return f"""
WITH trials AS (
  SELECT r.run_id,
       max(CASE WHEN p.key = 'sweep.id' THEN p.value END) AS sweep_id,
       max(CASE WHEN p.key = 'sweep.trial_id' THEN p.value END) AS trial_id,
       max(CASE WHEN p.key = 'seed' THEN p.value END) AS seed{"," if swept_keys else ""}
       {cols}
  FROM runs r JOIN run_params p ON p.run_id = r.run_id
  WHERE r.kind = 'trial'
  GROUP BY r.run_id
), scores AS (
  SELECT run_id, value, n, ci_low, ci_high FROM eval_metrics WHERE eval_id = 'trained' AND metric = ?
)
SELECT {group + "," if group else ""}
       count(*) AS n_seeds,
       avg(s.value) AS mean,
       stddev_samp(s.value) AS sd,
       list(s.value ORDER BY t.seed) AS per_seed,
       list(t.seed ORDER BY t.seed) AS seeds,
       list(t.trial_id ORDER BY t.seed) AS trial_ids,
       min(s.n) AS n_problems,
       min(s.ci_low) AS ci_low_single, max(s.ci_high) AS ci_high_single
FROM trials t JOIN scores s ON s.run_id = t.run_id
WHERE t.sweep_id = ?
{"GROUP BY " + group if group else ""}
ORDER BY {group or "n_seeds"}
"""


def sweep_pivot(sweep_id: str, swept_keys: list[str], metric: str = "accuracy_greedy",
                path: str | Path | None = None) -> list[dict[str, Any]]:
    """The pivot with a 95% interval across seeds (Student t); with one seed, the trial's own Wilson interval."""
    from scipy import stats

    rows = warehouse.query_records(pivot_sql(swept_keys), [metric, sweep_id], path)
    for r in rows:
        n = r["n_seeds"]
        if n >= 2 and r["sd"] is not None:
            half = stats.t.ppf(0.975, n - 1) * r["sd"] / math.sqrt(n)
            r["ci_low"], r["ci_high"], r["ci_kind"] = r["mean"] - half, r["mean"] + half, f"t over {n} seeds"
        else:
            r["ci_low"], r["ci_high"], r["ci_kind"] = r["ci_low_single"], r["ci_high_single"], "wilson (1 seed)"
        del r["ci_low_single"], r["ci_high_single"]
    return rows


# ------------------------------------------------------------------------------------------ tasks
def _check_flow_run(fr: Any, what: str) -> None:
    state = fr.state
    if state is None or state.is_completed():
        return
    msg = f"{what}: flow run {fr.name} ({fr.id}) ended {state.type.value}: {state.message or ''}"
    if state.is_crashed():  # lost worker / killed process: launching it again resumes from its checkpoint
        raise TransientError(msg)
    raise DeterministicError(msg)  # its stages already retried what was transient


@task(name="shared-stages", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=[5, 20],
      retry_condition_fn=retry_condition_fn)
def shared_stages(config: dict[str, Any], deployment: str | None, timeout_s: float) -> str:
    """Data → base model → pass-rate table → curriculum once, on the GPU pool (or inline without a deployment)."""
    if deployment is None:
        from flows.pipeline import pipeline_flow

        return pipeline_flow(config, stop_after="curriculum")["pass_rate_table_id"]
    fr = run_deployment(deployment, parameters={"config": config, "stop_after": "curriculum"},
                        timeout=timeout_s, as_subflow=True)
    _check_flow_run(fr, "shared stages")
    return str(fr.id)


@task(name="trial", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=[5, 20],
      retry_condition_fn=retry_condition_fn)
def run_trial(trial: Trial, sweep_id: str, parent_run_id: str, deployment: str | None, timeout_s: float) -> str:
    params = {"config": trial.config, "parent_run_id": parent_run_id, "sweep_id": sweep_id,
              "trial_id": trial.trial_id, "trial_label": trial.label}
    if deployment is None:  # inline (no server / worker): a subflow in this process
        from flows.pipeline import pipeline_flow

        return pipeline_flow(**params)["mlflow_run_id"]
    fr = run_deployment(deployment, parameters=params, timeout=timeout_s, as_subflow=True,
                        flow_run_name=f"{sweep_id}-{trial.trial_id}")
    _check_flow_run(fr, f"trial {trial.trial_id} ({trial.label})")
    return str(fr.id)


# ------------------------------------------------------------------------------------------ the flow
@flow(name="ablation-sweep", log_prints=True, validate_parameters=False)
def ablation_sweep_flow(sweep: str = "demo-2x2", max_parallel: int = 2, deployment: str | None = "pipeline/pipeline",
                        trial_timeout_s: float = 6 * 3600) -> dict[str, Any]:
    """`sweep`: a sweep name under configs/sweeps or a path. `deployment=None` runs trials inline (no worker)."""
    settings.configure_environment()
    log = get_run_logger()
    t0 = time.monotonic()
    path = find_sweep(sweep)
    if not path.is_absolute() and not path.exists():
        from tasks.pipeline import ROOT

        path = ROOT / path
    sw: Sweep = load_sweep(path)  # every trial validated; ConfigError names the file and field
    run_key = str(flow_run.id)[:8] if flow_run.id else time.strftime("%H%M%S")
    sweep_id = f"{sw.spec.name}-{run_key}"
    experiment = sw.base_config["tracking"]["experiment"]
    tracker = Tracker(experiment, sw.base_config["tracking"]["tracking_uri"])
    parent = tracker.start_run(sweep_id, {"kind": "sweep", "sweep_id": sweep_id, "sweep_name": sw.spec.name,
                                          "sweep_hash": sw.sweep_hash, "sweep_file": str(path),
                                          "prefect_flow_run_id": str(flow_run.id) if flow_run.id else None})
    log.info(f"sweep {sweep_id}: {len(sw.trials)} trials, MLflow parent run {parent}")
    try:
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
        tracker.end_run(parent, "FINISHED")
        return out
    except BaseException:
        tracker.end_run(parent, "FAILED")
        raise


def _aggregate(sw: Sweep, sweep_id: str, parent: str, tracker: Tracker, pivot: list[dict[str, Any]],
               children: list[Any]) -> dict[str, Any]:
    metric = sw.spec.metric
    table = [{**{k: r[k] for k in sw.swept_keys}, "n_seeds": r["n_seeds"], f"mean {metric}": round(r["mean"], 4),
              "95% CI": f"{r['ci_low']:.3f}–{r['ci_high']:.3f} ({r['ci_kind']})",
              "per seed": ", ".join(f"{v:.3f}" for v in r["per_seed"]), "trials": ", ".join(r["trial_ids"])}
             for r in pivot]
    key = "sweep-" + "".join(c if c.isalnum() else "-" for c in sweep_id.lower())
    create_table_artifact(table, key=key, description=f"{sw.spec.name}: {metric} by cell (95% CI across seeds)")
    links = "\n".join(f"- {c.data.tags.get('trial_id')} `{c.data.tags.get('trial_label')}`: "
                      f"{tracker.run_url(c.info.run_id)}" for c in sorted(children, key=lambda c: c.data.tags.get('trial_id', '')))
    create_markdown_artifact(f"# Sweep `{sweep_id}`\n\nMLflow parent run: {tracker.run_url(parent)}\n\n"
                             f"Trials:\n{links}\n\nWarehouse pivot: `flows.ablation_sweep.sweep_pivot('{sweep_id}', "
                             f"{sw.swept_keys!r})`\n", key=key + "-links", description="links to the MLflow runs")
    best = max(pivot, key=lambda r: r["mean"]) if pivot else None
    tracker.log_metrics(parent, {f"sweep/best_mean_{metric.replace('@', '_at_')}": best["mean"] if best else float("nan"),
                                 "sweep/cells": len(pivot), "sweep/trials": len(children)})
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "pivot.json"
        p.write_text(json.dumps(pivot, indent=2, default=str))
        tracker.log_artifact(parent, p)
    return {"sweep_id": sweep_id, "mlflow_parent_run_id": parent, "n_trials": len(sw.trials),
            "n_child_runs": len(children), "pivot": pivot, "swept_keys": sw.swept_keys,
            "best": {k: best[k] for k in sw.swept_keys} if best else None}
