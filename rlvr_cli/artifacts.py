"""`rlvr artifacts ls|get|open|index`: browse the artifact store (a local folder or S3).

`ls`, `get` and `open` take whatever rlvr printed (rlvr_core.records.locate): an s3:// URI, a local path, a
key or folder, a sweep id, a run id, an MLflow run id or run page."""

from __future__ import annotations

import contextlib
import webbrowser
from pathlib import Path
from typing import Iterator, Optional

import typer

from rlvr_cli.common import fail as _fail
from rlvr_core.artifacts.artifacts_index import CHECKPOINTS_NOTE_ID, INDEX, human_size, local_view, write_run_index
from rlvr_core.records.locate import Located, folder_groups, locate
from rlvr_core.artifacts.layout import RUN_FILE, resolve_run
from rlvr_core.artifacts.storage import join, open_store

artifacts_app = typer.Typer(no_args_is_help=True, help="Browse the artifact store (local folder or S3).")


REF_HELP = ("what rlvr printed: an s3:// URI or local path (file or folder), a key or folder of the store, a sweep "
            "id, a run id, an MLflow run id or run page URL")


@contextlib.contextmanager
def _one_line(command: str, ref: str) -> Iterator[None]:
    """Exit 1 with one line on what a user can cause: a wrong name, an unreachable S3 or MLflow, no credentials."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except (OSError, ValueError) as e:
        typer.echo(f"rlvr artifacts {command}: {one_line(e)}", err=True)
        raise typer.Exit(1) from None
    except (BotoCoreError, ClientError) as e:  # S3 unreachable, no credentials, no such bucket
        typer.echo(f"rlvr artifacts {command}: {ref}: {one_line(e)}", err=True)
        raise typer.Exit(1) from None


def _locate(ref: str, artifact_uri: Optional[str], command: str) -> Located:
    with _one_line(command, ref):
        return locate(ref, open_store(artifact_uri))


def one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _print_groups(loc: Located, flat: bool) -> None:
    """A folder's keys: grouped by run or sweep folder with counts and sizes; a single run's keys one by one."""
    sizes = loc.store.sizes(loc.key)
    if flat:
        for key in sorted(sizes):
            typer.echo(key)
        return
    groups = folder_groups(sizes)
    width = max([len(g["folder"]) + 1 for g in groups] + [10])
    for g in groups:
        folder = (g["folder"] or ".") + "/"
        typer.echo(f"{g['kind']:6} {folder:{width}}  {g['files']:5} files  {human_size(g['bytes']):>9}")
        if len(groups) == 1:  # one run: its files, by key (what `get` and `open` take)
            for key in g["keys"]:
                typer.echo(f"       {human_size(sizes[key]):>9}  {key}")
    typer.echo(f"{len(groups)} folder{'s' * (len(groups) != 1)}, {len(sizes)} files, "
               f"{human_size(sum(sizes.values()))} in {loc.url}")


@artifacts_app.command("ls")
def artifacts_ls(ref: str = typer.Argument("", help=REF_HELP + "; default: the whole store"),
                 flat: bool = typer.Option(False, "--flat", help="every key on its own line, nothing else"),
                 artifact_uri: Optional[str] = typer.Option(None, help="artifact store root")) -> None:
    """List what is under REF, grouped by run and sweep folder (files, total size); --flat: every key."""
    loc = _locate(ref, artifact_uri, "ls")
    with _one_line("ls", ref):
        if loc.is_file:
            typer.echo(loc.key if flat else f"{human_size(loc.store.sizes(loc.key)[loc.key])}  {loc.key}")
        else:
            _print_groups(loc, flat)


@artifacts_app.command("get")
def artifacts_get(ref: str = typer.Argument(..., help="one file: " + REF_HELP),
                  dest: Path = typer.Argument(..., help="local file to write"),
                  artifact_uri: Optional[str] = typer.Option(None, help="artifact store root")) -> None:
    """Copy one artifact to a local file."""
    loc = _locate(ref, artifact_uri, "get")
    if not loc.is_file:
        _fail(f"rlvr artifacts get: {loc.url} is a folder; list it with: rlvr artifacts ls {ref}", 1)
    with _one_line("get", ref):
        loc.store.get_file(loc.key, dest)
    typer.echo(str(dest))


@artifacts_app.command("open")
def artifacts_open(
    ref: str = typer.Argument("", help=REF_HELP),
    print_only: bool = typer.Option(False, "--print", help="print the local path; do not start a browser"),
    with_checkpoints: bool = typer.Option(False, "--with-checkpoints", help="also download checkpoints/ (S3)"),
    artifact_uri: Optional[str] = typer.Option(None, help="artifact store root (default: RLVR_ARTIFACT_URI)"),
) -> None:
    """Open a file, or a folder's index.html (run and sweep folders have one), downloaded to a local cache when
    on S3. A folder without index.html is listed as `ls` lists it. Exits 1, in one line, when nothing matches."""
    loc = _locate(ref, artifact_uri, "open")
    with _one_line("open", ref):
        if not loc.is_file and not loc.store.exists(join(loc.key, INDEX)):
            _print_groups(loc, flat=False)
            if loc.key and loc.store.exists(join(loc.key, RUN_FILE)):
                typer.echo(f"(no {INDEX} in this run folder; write one with: rlvr artifacts index {loc.key})",
                           err=True)
            return
        path = local_view(loc.store, loc.key, is_file=loc.is_file, with_checkpoints=with_checkpoints)
    if path.suffix in (".html", ".htm") and CHECKPOINTS_NOTE_ID in path.read_text(encoding="utf-8", errors="replace"):
        typer.echo("(links into checkpoints/ are left out of this local copy: add --with-checkpoints)", err=True)
    typer.echo(str(path))  # last: the path is the last line a script reads, stderr mixed in or not
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
