"""`rlvr artifacts ls|get|open|index`: browse the artifact store (a local folder or S3)."""

from __future__ import annotations

import webbrowser
from pathlib import Path
from typing import Optional

import typer

from rlvr_cli.common import fail as _fail
from rlvr_core.artifacts.artifacts_index import local_view, write_run_index
from rlvr_core.artifacts.layout import resolve_run
from rlvr_core.artifacts.storage import open_store

artifacts_app = typer.Typer(no_args_is_help=True, help="Browse the artifact store (local folder or S3).")


@artifacts_app.command("ls")
def artifacts_ls(prefix: str = typer.Argument("", help="key prefix, e.g. rlvr-demo/RUN_ID"),
                 artifact_uri: Optional[str] = typer.Option(None, help="artifact store root")) -> None:
    """List artifact keys under PREFIX."""
    for key in open_store(artifact_uri).list(prefix):
        typer.echo(key)


@artifacts_app.command("get")
def artifacts_get(key: str, dest: Path = typer.Argument(..., help="local file to write"),
                  artifact_uri: Optional[str] = typer.Option(None, help="artifact store root")) -> None:
    """Copy one artifact to a local file."""
    try:
        open_store(artifact_uri).get_file(key, dest)
    except FileNotFoundError as e:
        _fail(str(e), 1)
    typer.echo(str(dest))


@artifacts_app.command("open")
def artifacts_open(
    key: str = typer.Argument("", help="an artifact key, a run or sweep folder, or a run id, e.g. "
                                       "rlvr-demo/demo-1a2b3c4d"),
    print_only: bool = typer.Option(False, "--print", help="print the local path; do not start a browser"),
    with_checkpoints: bool = typer.Option(False, "--with-checkpoints", help="also download checkpoints/ (S3)"),
    artifact_uri: Optional[str] = typer.Option(None, help="artifact store root (default: RLVR_ARTIFACT_URI)"),
) -> None:
    """Open an artifact, or a run's or sweep's index.html (downloaded to a local cache when on S3).
    Exits 1, saying why, when there is no such key or the folder has no index.html."""
    try:
        path = local_view(open_store(artifact_uri), key, with_checkpoints=with_checkpoints)
    except FileNotFoundError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1)
    typer.echo(str(path))
    if not print_only:
        webbrowser.open(path.resolve().as_uri())


@artifacts_app.command("index")
def artifacts_index(
    run: str = typer.Argument(..., help="run folder (EXPERIMENT/NAME-ID, EXPERIMENT/SWEEP/TRIAL) or run id"),
    artifact_uri: Optional[str] = typer.Option(None, help="artifact store root (default: RLVR_ARTIFACT_URI)"),
) -> None:
    """(Re)write a run folder's index.html from the files it holds now."""
    store = open_store(artifact_uri)
    try:
        key = write_run_index(store, run if store.list(run.strip("/")) else resolve_run(store, run))
    except FileNotFoundError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1)
    typer.echo(store.url(key))
