"""`rlvr warehouse query|ingest`, `rlvr report RUN` and `rlvr dashboard`: the warehouse and the views over it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Optional

import duckdb
import typer

from rlvr_cli.common import fail as _fail
from rlvr_cli.common import print_table as _print_table
from rlvr_core.artifacts.storage import open_store
from rlvr_core.core import settings
from rlvr_core.records import warehouse
from rlvr_core.records import warehouse_queries as wq
from rlvr_core.records.report import ReportError, build_report
from rlvr_core.records.tracking import ui_home
from rlvr_core.records.warehouse_queries import QueryError, describe, list_queries, load, parse_cli_params

APP_PATH = Path(__file__).resolve().parent.parent / "dashboards" / "app.py"


def query_command(
    sql: Optional[str] = typer.Argument(None, help="SQL to run read-only (or --canned NAME)"),
    canned: Optional[str] = typer.Option(None, "--canned", help="a canned query from dashboards/queries/, by name"),
    param: list[str] = typer.Option([], "--param", help="a canned query's parameter NAME=VALUE (repeatable)"),
    list_canned: bool = typer.Option(False, "--list", help="list the canned queries and their parameters"),
    json_out: bool = typer.Option(False, "--json", help="rows as a JSON list of objects"),
) -> None:
    """Run SQL, or a canned query, against the warehouse (read-only)."""
    if list_canned:
        typer.echo("\n\n".join(describe(q) for q in list_queries()))
        return
    if (sql is None) == (canned is None):
        _fail("give either SQL or --canned NAME (`rlvr warehouse query --list` shows the canned queries)", 2)
    if param and not canned:
        _fail("--param goes with --canned NAME", 2)
    try:
        params = None
        if canned:
            q = load(canned)
            sql, params = q.sql, q.bind(parse_cli_params(param))
        if json_out:
            print(json.dumps(warehouse.query_records(sql, params)))
            return
        cols, rows = warehouse.query(sql, params)
    except QueryError as e:
        _fail(str(e), 2)
    except (duckdb.Error, FileNotFoundError) as e:
        _fail(f"query failed: {e}", 1)
    _print_table(cols, rows)


def ingest_command(
    run: Optional[str] = typer.Argument(None, help="run folder in the artifact store, e.g. EXPERIMENT/NAME-ID8 (docs/artifacts.md)"),
    all_runs: bool = typer.Option(False, "--all", help="every run folder in the store (unchanged ones are skipped; "
                                                       "an interrupted call resumes)"),
    force: bool = typer.Option(False, "--force", help="re-read runs whose files have not changed"),
    artifact_uri: Optional[str] = typer.Option(None, help="artifact store root"),
) -> None:
    """(Re-)ingest run folders into the warehouse; idempotent."""
    if (run is None) == (not all_runs):
        _fail("give a run folder (EXPERIMENT/NAME-ID8) or --all", 2)
    store = open_store(artifact_uri)
    try:
        out = warehouse.ingest_all(store, force=force) if all_runs else warehouse.ingest_run(store, run, force=force)
    except (warehouse.IngestError, FileNotFoundError) as e:
        _fail(str(e), 1)
    typer.echo(json.dumps(out))


def report_command(run_id: str = typer.Argument(..., help="run id (runs.run_id in the warehouse)"),
                   artifact_uri: Optional[str] = typer.Option(None, help="artifact store root (default: configured)")
                   ) -> None:
    """Write a static HTML report of one run (figures included) into the artifact store."""
    try:
        url = build_report(run_id, store=open_store(artifact_uri))
    except (ReportError, FileNotFoundError, wq.QueryError) as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1)
    typer.echo(url)


def dashboard_command(port: int = typer.Option(8501, help="port to serve on"),
                      host: str = typer.Option("127.0.0.1", help="address to bind (0.0.0.0 to share on a network)"),
                      warehouse: Optional[Path] = typer.Option(None, help="warehouse file (default: configured)")
                      ) -> None:
    """Start the Streamlit dashboard over the warehouse (read-only). Stopping this command (Ctrl-C,
    `kill -TERM`, a closed terminal) stops the Streamlit server it started."""
    env = dict(os.environ)
    if warehouse:
        env["RLVR_WAREHOUSE"] = str(Path(warehouse).resolve())
    cmd = [sys.executable, "-m", "streamlit", "run", str(APP_PATH), "--server.address", host,
           "--server.port", str(port), "--server.headless", "true", "--browser.gatherUsageStats", "false"]
    typer.echo(f"dashboard on http://{host}:{port}  (warehouse {env.get('RLVR_WAREHOUSE') or settings.warehouse_path()})",
               err=True)
    raise typer.Exit(run_forwarding_signals(cmd, env))


def ui_command(port: int = typer.Option(5000, help="port on 127.0.0.1"),
               backend_store_uri: Optional[str] = typer.Option(
                   None, help="MLflow store (default: MLFLOW_TRACKING_URI, else this project's .rlvr/mlflow)")
               ) -> None:
    """Serve MLflow's UI for this project's runs on 127.0.0.1, opening in the model-training view from any link
    (`mlflow ui` as the stack runs it: rlvr_core/records/mlflow_ui.py). Stopping this command stops the server."""
    uri = backend_store_uri or settings.mlflow_tracking_uri()
    if uri.startswith(("http://", "https://")):
        typer.echo(f"MLflow is a server already (MLFLOW_TRACKING_URI): {ui_home(uri)}", err=True)
        raise typer.Exit(0)
    cmd = [sys.executable, "-m", "rlvr_core.records.mlflow_ui", "ui", "--host", "127.0.0.1", "--port", str(port),
           "--workers", "1", "--backend-store-uri", uri]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # its job runner: unused here
    typer.echo(f"MLflow UI on {ui_home(f'http://127.0.0.1:{port}')}  (store {uri})", err=True)
    raise typer.Exit(run_forwarding_signals(cmd, env))


def run_forwarding_signals(cmd: list[str], env: dict[str, str]) -> int:
    """Run `cmd` as a child and wait for it; SIGTERM, SIGINT and SIGHUP sent to this process are passed on
    to it, so the child never outlives the command (a plain subprocess.call leaves it running on SIGTERM).
    A signal this process was started ignoring (SIGHUP under nohup) stays ignored, by both."""
    proc = subprocess.Popen(cmd, env=env)
    sigs = tuple(s for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP) if signal.getsignal(s) != signal.SIG_IGN)

    def forward(signum, _frame) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in sigs}
    try:
        return proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if proc.poll() is None:  # this process is leaving for another reason: do not leave the server behind
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
