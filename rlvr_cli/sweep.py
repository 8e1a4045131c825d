"""`rlvr sweep run|status|show`: submit an ablation sweep to the Prefect server, follow it, print its pivot.

    rlvr sweep run demo-lr --watch             validate every trial here, submit `ablation-sweep/...`, follow
                                               the trials, end with the pivot and the MLflow parent link
    rlvr sweep run my.yaml --set seeds=[0,1,2,3] --set grpo.steps=8 --no-watch
    rlvr sweep status [FLOW_RUN_ID|NAME]       the sweep's state and each trial's (the latest sweep by default)
    rlvr sweep show NAME_OR_SWEEP_ID           the pivot from the warehouse (no Prefect needed)

Prefect is imported only inside `run` and `status` (flows/sweep_cli.py); validation and `show` need none.
Exit codes: 0 = done (or submitted), 1 = the sweep failed, 2 = bad input (nothing submitted).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

from rlvr_cli.common import fail as _fail
from rlvr_cli.common import parse_sets
from rlvr_core.experiment.config import ConfigError
from rlvr_core.pipeline.sweeps import (find_sweep, format_pivot, load_sweep, one_line_error, pivot_rows,
                                       submitted_mapping, sweep_pivot, swept_keys_from_params)
from rlvr_core.records import warehouse

sweep_app = typer.Typer(no_args_is_help=True, help="Run ablation sweeps on the Prefect server and show their pivot.")


def _overrides(sets: list[str]) -> dict[str, Any]:
    return parse_sets(sets)


@sweep_app.command("run")
def sweep_run(
    sweep: str = typer.Argument(..., help="a sweep file, or a name under configs/sweeps (demo-lr)"),
    set_: list[str] = typer.Option([], "--set", help="a sweep field (seeds=[0,1,2], metric=pass@4), a grid entry "
                                   "(grid.grpo.lr=[1e-5,2e-5]) or an experiment field for every trial (grpo.steps=8)"),
    watch: bool = typer.Option(True, "--watch/--no-watch", help="follow the sweep and print its pivot at the end"),
    deployment: Optional[str] = typer.Option(None, help="default: ablation-sweep/<sweep name>, else ablation-sweep/sweep"),
    max_parallel: Optional[int] = typer.Option(None, min=1, help="trials at a time (default: the deployment's)"),
) -> None:
    """Validate the sweep and every trial's config, submit it to PREFECT_API_URL, and (--watch) follow it."""
    try:  # before Prefect is imported, and before anything reaches the server
        path = find_sweep(sweep)
        sw, mapping = submitted_mapping(path, _overrides(set_))
    except ConfigError as e:
        _fail(f"invalid sweep: {one_line_error(str(e))}")
    from flows import sweep_cli as pc

    params: dict[str, Any] = {"sweep": mapping, "sweep_source": str(path)}
    if max_parallel:
        params["max_parallel"] = max_parallel
    names = [deployment] if deployment else [f"ablation-sweep/{sw.spec.name}", "ablation-sweep/sweep"]
    try:
        fr, dep = pc.submit(sw.spec.name, params, names)
    except pc.SweepCliError as e:
        _fail(str(e))
    cells = len(sw.trials) // len(sw.spec.seeds)
    typer.echo(f"submitted sweep {sw.spec.name}: {len(sw.trials)} trials ({cells} cells × {len(sw.spec.seeds)} seeds) "
               f"as flow run {fr.name} ({fr.id}) of {dep}\n  Prefect UI: {pc.ui_url(fr.id)}\n"
               f"  follow it:  rlvr sweep status {fr.id}", err=True)
    if watch:
        try:
            snap = pc.watch(fr.id, lambda line: typer.echo(line, err=True))
        except KeyboardInterrupt:
            _fail(f"stopped watching; the sweep goes on: rlvr sweep status {fr.id}", 130)
        _report(pc, snap)


@sweep_app.command("status")
def sweep_status(ref: Optional[str] = typer.Argument(None, help="flow run id, sweep id or sweep name (default: the latest)")) -> None:
    """The sweep's state and each trial's; the pivot when it has finished, its error in one line when it failed."""
    from flows import sweep_cli as pc

    try:
        fr = pc.find_sweep_run(ref)
        snap = pc.snapshot(fr.id)
    except pc.SweepCliError as e:
        _fail(str(e))
    typer.echo(f"sweep {pc._sweep_name(fr)}: flow run {fr.name} ({fr.id}): {snap.state}\n  Prefect UI: {pc.ui_url(fr.id)}")
    for t in snap.trials:
        typer.echo(f"  {t.key:<6} {t.label}: {t.state}" + (f" — {t.error}" if t.error else ""))
    if snap.final:
        _report(pc, snap)


def _report(pc: Any, snap: Any) -> None:
    """The end of a sweep: the pivot, the MLflow parent run and the artifacts; or the error in one line (exit 1)."""
    if not snap.flow_run.state.is_completed():
        _fail(f"sweep {snap.state}: {snap.error or 'no message'}", 1)
    res = pc.results(snap.flow_run.id)
    if res["rows"] is None:
        _fail("the sweep completed but left no pivot artifact (an older flow version?)", 1)
    typer.echo(f"sweep {pc._sweep_name(snap.flow_run)}-{str(snap.flow_run.id)[:8]}: {snap.state}")
    typer.echo(format_pivot(res["rows"], res["swept_keys"], res["metric"]))
    link = res["mlflow"] or ""
    run_id = link.split("/runs/", 1)[-1].split("?", 1)[0]
    typer.echo(f"MLflow parent run: {link}" if link.startswith("http") else
               f"MLflow parent run: {run_id} in {link.split('#', 1)[0]} (a file store: `mlflow ui` opens it)")
    if (res.get("compare") or "").startswith("http"):
        typer.echo(f"MLflow compare view: {res['compare']}")
    typer.echo(f"artifacts: {res['artifacts']}")


# ------------------------------------------------------------------------------------------ show (warehouse only)
def _find_sweep_id(ref: str, path: Optional[Path]) -> str:
    ids = warehouse.query_records(
        "SELECT p.value AS sweep_id, max(r.started_at) AS started FROM run_params p JOIN runs r USING (run_id) "
        "WHERE p.key = 'sweep.id' AND r.kind = 'trial' GROUP BY 1 ORDER BY started DESC NULLS LAST", None, path)
    for r in ids:
        if r["sweep_id"] == ref:
            return ref
    for r in ids:  # a sweep name: its latest run
        if r["sweep_id"].startswith(f"{ref}-") and len(r["sweep_id"]) == len(ref) + 9:
            return r["sweep_id"]
    known = ", ".join(r["sweep_id"] for r in ids[:10]) or "none yet"
    _fail(f"no sweep {ref!r} in the warehouse ({path or 'default'}); sweeps there: {known}")
    raise AssertionError  # unreachable


@sweep_app.command("show")
def sweep_show(
    ref: str = typer.Argument(..., help="sweep id (demo-lr-1a2b3c4d) or sweep name (its latest run)"),
    metric: Optional[str] = typer.Option(None, help="default: the sweep file's metric, else accuracy_greedy"),
    warehouse_path: Optional[Path] = typer.Option(None, "--warehouse", help="DuckDB file (default: $RLVR_HOME's)"),
    json_out: bool = typer.Option(False, "--json", help="print the pivot rows as JSON"),
) -> None:
    """The pivot of a sweep from the warehouse: one row per cell, mean, 95% CI across seeds, per-seed values."""
    sweep_id = _find_sweep_id(ref, warehouse_path)
    rows = warehouse.query_records(
        "SELECT run_id, key, value FROM run_params WHERE run_id IN "
        "(SELECT run_id FROM run_params WHERE key = 'sweep.id' AND value = ?)", [sweep_id], warehouse_path)
    params: dict[str, dict[str, str]] = {}
    for r in rows:
        params.setdefault(r["run_id"], {})[r["key"]] = r["value"]
    keys = swept_keys_from_params(params)
    metric = metric or _file_metric(sweep_id)
    table = pivot_rows(sweep_pivot(sweep_id, keys, metric, warehouse_path), keys)
    if json_out:
        typer.echo(json.dumps({"sweep_id": sweep_id, "metric": metric, "swept_keys": keys, "rows": table}))
        return
    typer.echo(f"sweep {sweep_id}: {len(params)} trials")
    typer.echo(format_pivot(table, keys, metric))


def _file_metric(sweep_id: str) -> str:
    name = sweep_id[:-9]
    try:
        return load_sweep(find_sweep(name)).spec.metric
    except ConfigError:
        return "accuracy_greedy"
