"""`rlvr stack up|down|status|env`: the local team stack (rlvr_core.pipeline.stack), with Prefect started and
stopped by the orchestration layer's hooks (flows.local_stack). `python -m rlvr_cli.stack up` works too."""

from __future__ import annotations

import json
from typing import Any, Optional

import typer

from flows import local_stack
from rlvr_core.pipeline.stack import (BUCKET, DEFAULT_MLFLOW_PORT, DEFAULT_PG_PORT, DEFAULT_PREFECT_PORT,
                                      DEFAULT_S3_PORT, StackError, down, read_state, stack_dir, state_path, status, up)
from rlvr_core.records.tracking import ui_home

stack_app = typer.Typer(no_args_is_help=True, help="A local team stack (MLflow server, S3, Prefect) on 127.0.0.1.")


def _print_env(env: dict[str, str]) -> None:
    for k, v in env.items():
        typer.echo(f"export {k}={v}")


@stack_app.command("up")
def up_command(
    mlflow_port: int = typer.Option(DEFAULT_MLFLOW_PORT, help="MLflow server port on 127.0.0.1 (0: any free port)"),
    s3_port: int = typer.Option(DEFAULT_S3_PORT, help="S3 port on 127.0.0.1 (0: any free port)"),
    prefect_port: int = typer.Option(DEFAULT_PREFECT_PORT, help="Prefect server and UI port (0: any free port)"),
    pg_port: int = typer.Option(DEFAULT_PG_PORT, help="PostgreSQL (Prefect's database) port (0: any free port)"),
    prefect_db: str = typer.Option("postgres", help="Prefect's database: postgres, or sqlite (light use only: "
                                                    "its scheduler and workers contend for SQLite's one writer)"),
    nightly_cron: Optional[str] = typer.Option(None, help="cron of the nightly-eval deployment (UTC); on a running "
                                                          "stack it changes the schedule. Default: the one deployed "
                                                          "(kept across restarts), else '0 3 * * *'"),
    no_s3: bool = typer.Option(False, "--no-s3", help="artifacts in a local folder, no S3 server"),
    no_prefect: bool = typer.Option(False, "--no-prefect", help="do not start the Prefect server and worker"),
    json_out: bool = typer.Option(False, "--json", help="print the state as JSON instead of export lines"),
) -> None:
    """Start the stack on 127.0.0.1 and print the environment to export (eval "$(rlvr stack env)")."""
    try:
        if nightly_cron is not None and not no_prefect:
            local_stack.check_cron(nightly_cron)
    except ValueError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(2)
    try:
        state = up(mlflow_port=mlflow_port, s3_port=s3_port, s3=not no_s3, prefect=not no_prefect,
                   prefect_port=prefect_port, prefect_db=prefect_db, pg_port=pg_port, nightly_cron=nightly_cron,
                   prefect_hooks=local_stack, progress=lambda line: typer.echo(f"  {line}", err=True))
    except StackError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1)
    if json_out:
        typer.echo(json.dumps(state))
        return
    typer.echo(("stack already running" if state.get("already_running") else "stack up") +
               f" (state: {state_path()}, logs: {stack_dir() / 'logs'})", err=True)
    for what, url in _urls(state):
        typer.echo(f"  {what:12} {url}", err=True)
    _print_env(state["env"])


def _schedule_line(state: dict[str, Any], live: bool = False) -> str | None:
    """The nightly-eval schedule: the server's (`live`: asked now, as it may have changed in Prefect's UI), else
    the one the state recorded."""
    pf = state.get("prefect") or {}
    sch = local_stack.nightly_schedule(pf["api_url"]) if live and pf.get("api_url") else None
    cron = (sch or {}).get("cron") or pf.get("nightly_cron")
    if not cron:
        return None
    paused = " (paused in Prefect)" if sch and not sch.get("active", True) else ""
    return f"cron '{cron}' UTC{paused}; change it: rlvr stack up --nightly-cron 'CRON'"


def _urls(state: dict[str, Any]) -> list[tuple[str, str]]:
    out = [("MLflow UI", ui_home(state["mlflow"]["url"]))]
    if (state.get("prefect") or {}).get("ui_url"):
        out.append(("Prefect UI", state["prefect"]["ui_url"]))
        if _schedule_line(state):
            out.append(("nightly-eval", _schedule_line(state)))
    if state.get("s3"):
        out.append(("S3", f"{state['s3']['url']} bucket {BUCKET} (on disk: {state['s3']['data']})"))
    return out


@stack_app.command("down")
def down_command(delete_data: bool = typer.Option(False, "--delete-data",
                                                  help="also delete the stack's data: every artifact, checkpoint "
                                                       "and report in its S3, MLflow's and Prefect's databases")) -> None:
    """Stop the processes `up` started (by the pids in the state file). The data stays for the next `up`."""
    try:
        result = down(delete_data=delete_data, prefect_hooks=local_stack)
    except StackError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1)
    typer.echo(json.dumps(result) if result else "no stack recorded in " + str(state_path()))
    if delete_data:
        for path in (result.get("deleted") or "").split("; "):
            if path and path != "nothing":
                typer.echo(f"deleted {path}", err=True)
    if not delete_data:
        typer.echo(f"data kept in {stack_dir()} (artifacts, checkpoints, runs); `up` serves it again", err=True)


@stack_app.command("status")
def status_command(json_out: bool = typer.Option(False, "--json", help="machine-readable")) -> None:
    """Exit 0 when every component is alive and answering, 1 otherwise."""
    st = status()
    if json_out:
        typer.echo(json.dumps(st))
    elif not st["components"]:
        typer.echo("no stack recorded in " + str(state_path()))
    else:
        for name, c in st["components"].items():
            if "skipped" in c:
                typer.echo(f"{name:8} skipped ({c['skipped']})")
            else:
                ok = "up" if c["alive"] and c["healthy"] else ("alive, not answering" if c["alive"] else "down")
                typer.echo(f"{name:8} {ok:22} {c['url']}  pid {c.get('pid', c.get('pids'))}")
    raise typer.Exit(0 if st["running"] else 1)


@stack_app.command("env")
def env_command(name: Optional[str] = typer.Argument(None, help="print only this variable's value")) -> None:
    """Print `export` lines for the running stack (use: eval "$(rlvr stack env)")."""
    state = read_state()
    if state is None or "env" not in state:
        typer.echo("no stack running (rlvr stack up)", err=True)
        raise typer.Exit(1)
    if name:
        typer.echo(state["env"].get(name, ""))
    else:
        _print_env(state["env"])
        line = _schedule_line(state, live=True)
        if line:
            typer.echo(f"nightly-eval schedule: {line}", err=True)  # stderr: stdout stays `eval`-able


if __name__ == "__main__":
    stack_app()
