"""Training-run analysis across runs (seed `002_…`), generated from the warehouse.

    rlvr probe runs --experiment ablate --out reports/ablate          # or --run ID (repeatable)

One markdown report (+ JSON, + a figure) answering the questions of a cross-run analysis:

1. **Hyperparameters**: the resolved-config params that differ between the runs (equal ones are listed
   once, collapsed), so the table shows what the runs actually varied.
2. **Final accuracies** with their 95% intervals and n: every `accuracy_greedy` metric of the runs'
   evaluations, per benchmark and checkpoint (base and trained side by side).
3. **Dynamics at chosen steps**: training metrics (reward, KL to the reference, entropy, grad norm,
   clip fraction, completion length by default) at the chosen steps; by default the first, the middle
   and the last step each run has.
4. **Runs flagged by guards**: every guard firing with its step, whether it stopped the run, the reason
   and its evidence (collapse, ratio explosion, entropy, repetitive output, …), and the runs tagged
   `collapsed`.

Everything comes from the warehouse tables (runs, run_params, eval_metrics, train_steps, health_events,
run_tags), read-only, so a report can be rebuilt at any time from the artifact store.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlvr_core.records import warehouse

DEFAULT_METRICS = ("reward_mean", "kl_ref_mean", "entropy", "grad_norm", "clip_frac", "completion_len_mean")


def _in(ids: list[str]) -> str:
    return "(" + ", ".join("?" for _ in ids) + ")"


def _q(sql: str, params: list[Any], db: str | Path | None) -> list[dict[str, Any]]:
    return warehouse.query_records(sql, params, path=db)


def select_runs(run_ids: list[str] | None, experiment: str | None, db: str | Path | None) -> list[dict[str, Any]]:
    if run_ids:
        rows = _q(f"select run_id, experiment, name, kind, status from runs where run_id in {_in(run_ids)} "
                  "order by run_id", list(run_ids), db)
        missing = sorted(set(run_ids) - {r["run_id"] for r in rows})
        if missing:
            raise ValueError(f"runs not in the warehouse: {missing} (ingest them first: rlvr warehouse ingest)")
        return rows
    if not experiment:
        raise ValueError("give run ids or an experiment")
    rows = _q("select run_id, experiment, name, kind, status from runs where experiment = ? order by run_id",
              [experiment], db)
    if not rows:
        raise ValueError(f"no runs of experiment {experiment!r} in the warehouse")
    return rows


def training_run_report(out_dir: str | Path, *, run_ids: list[str] | None = None, experiment: str | None = None,
                        steps: list[int] | None = None, metrics: tuple[str, ...] = DEFAULT_METRICS,
                        db: str | Path | None = None) -> dict[str, Any]:
    """Write training_report.md/.json (and training_curves.png) into `out_dir`; return the JSON."""
    runs = select_runs(run_ids, experiment, db)
    ids = [r["run_id"] for r in runs]

    params = _q(f"select run_id, key, value from run_params where run_id in {_in(ids)}", ids, db)
    by_key: dict[str, dict[str, str]] = {}
    for p in params:
        by_key.setdefault(p["key"], {})[p["run_id"]] = p["value"]
    varied = {k: v for k, v in sorted(by_key.items()) if len(set(v.get(i) for i in ids)) > 1}
    constant = {k: next(iter(v.values())) for k, v in sorted(by_key.items()) if k not in varied}

    accuracies = _q(f"select run_id, benchmark, checkpoint, value, ci_low, ci_high, n from eval_metrics "
                    f"where metric = 'accuracy_greedy' and run_id in {_in(ids)} "
                    "order by run_id, benchmark, checkpoint", ids, db)

    span = {r["run_id"]: (r["first"], r["last"]) for r in _q(
        f"select run_id, min(step) as first, max(step) as last from train_steps where run_id in {_in(ids)} "
        "group by run_id", ids, db)}
    dynamics: list[dict[str, Any]] = []
    for rid in ids:
        if rid not in span:
            continue  # no training steps (an evaluation-only run)
        lo, hi = span[rid]
        chosen = sorted(set(steps or [lo, (lo + hi) // 2, hi]))
        rows = _q(f"select step, metric, value from train_steps where run_id = ? and step in {_in(chosen)} "
                  f"and metric in {_in(list(metrics))} order by step", [rid, *chosen, *metrics], db)
        for s in chosen:
            vals = {r["metric"]: r["value"] for r in rows if r["step"] == s}
            if vals:
                dynamics.append({"run_id": rid, "step": s, **{m: vals.get(m) for m in metrics}})

    firings = _q(f"select run_id, step, guard_id, serious, reason, evidence from health_events "
                 f"where run_id in {_in(ids)} order by run_id, step, guard_id", ids, db)
    collapsed = [r["run_id"] for r in _q(f"select distinct run_id from run_tags where key = 'collapsed' "
                                         f"and value = 'true' and run_id in {_in(ids)} order by run_id", ids, db)]

    report = {"runs": runs, "varied_params": varied, "constant_params": constant, "accuracies": accuracies,
              "dynamics": dynamics, "metrics": list(metrics), "guard_firings": firings, "collapsed": collapsed}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "training_report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    figure = _figure(ids, firings, out, db)
    (out / "training_report.md").write_text(_markdown(report, figure))
    return report


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v).replace("|", "\\|")


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(_fmt(c) for c in r) + " |" for r in rows])


def _markdown(r: dict[str, Any], figure: str | None) -> str:
    ids = [x["run_id"] for x in r["runs"]]
    lines = [f"# Training-run analysis: {len(ids)} runs", ""]
    lines += _table(["run", "experiment", "kind", "status", "collapsed"],
                    [[x["run_id"], x["experiment"], x["kind"], x["status"], x["run_id"] in r["collapsed"]]
                     for x in r["runs"]]) + [""]
    lines += ["## Hyperparameters that differ", ""]
    if r["varied_params"]:
        lines += _table(["param", *ids], [[k, *(v.get(i) for i in ids)] for k, v in r["varied_params"].items()])
    else:
        lines.append("(none: the runs share every param)")
    lines += ["", f"{len(r['constant_params'])} params are the same in every run (training_report.json).", ""]
    lines += ["## Final accuracies (greedy, 95% Wilson interval)", ""]
    lines += _table(["run", "benchmark", "checkpoint", "accuracy", "95% CI", "n"],
                    [[a["run_id"], a["benchmark"], a["checkpoint"], a["value"],
                      f"[{_fmt(a['ci_low'])}, {_fmt(a['ci_high'])}]", a["n"]] for a in r["accuracies"]]) + [""]
    lines += ["## Dynamics at chosen steps", ""]
    lines += _table(["run", "step", *r["metrics"]], [[d["run_id"], d["step"], *(d[m] for m in r["metrics"])]
                                                     for d in r["dynamics"]]) + [""]
    if figure:
        lines += [f"![reward per step, guard firings marked]({figure})", ""]
    lines += ["## Runs flagged by guards", ""]
    if r["guard_firings"]:
        lines += _table(["run", "step", "guard", "stopped the run", "reason", "evidence"],
                        [[f["run_id"], f["step"], f["guard_id"], bool(f["serious"]), f["reason"], f["evidence"]]
                         for f in r["guard_firings"]])
    else:
        lines.append("No guard fired.")
    return "\n".join(lines) + "\n"


def _figure(ids: list[str], firings: list[dict[str, Any]], out: Path, db: str | Path | None) -> str | None:
    rows = _q(f"select run_id, step, value from train_steps where metric = 'reward_mean' and run_id in {_in(ids)} "
              "order by run_id, step", ids, db)
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    for rid in ids:
        pts = [(r["step"], r["value"]) for r in rows if r["run_id"] == rid]
        if pts:
            ax.plot(*zip(*pts), label=rid, linewidth=1)
    for f in firings:
        ax.axvline(f["step"], color="red" if f["serious"] else "orange", linestyle="--", linewidth=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("reward_mean")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "training_curves.png", dpi=110)
    plt.close(fig)
    return "training_curves.png"
