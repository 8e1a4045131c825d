"""Browsing the artifact store: a run's `index.html`, and `rlvr artifacts open|index`.

Every run folder (`<experiment>/<run_id>/`, layout in docs/artifacts.md) gets an `index.html` at its
root listing its reports and files with *relative* links, so the page works wherever the folder is:
opened from a laptop's store, from a copy downloaded out of S3, or from a static web server in front
of the bucket. It is a browsing aid derived from the folder, rewritten whenever a stage adds files
(`write_run_index`), and never read by the pipeline.
"""

from __future__ import annotations

import html
import json
import time
import webbrowser
from pathlib import Path
from typing import Optional
from urllib.parse import quote

import typer

from rlvr_core.storage import ArtifactStore, LocalStore, S3Store, join

INDEX = "index.html"
# Folders of a run, in the order the page shows them; anything else follows alphabetically.
SECTIONS = ("reports", "evals", "passk", "curriculum", "train", "probes", "checkpoints")
_RUN_FIELDS = ("experiment", "name", "kind", "status", "started_at", "finished_at", "duration_s", "config_hash",
               "git_sha", "model_id", "dataset_hash", "mlflow_run_id", "prefect_flow_run_id")


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _fmt(v) -> str:
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def _link(rel: str, text: str | None = None) -> str:
    return f'<a href="{html.escape(quote(rel))}">{html.escape(text or rel)}</a>'


def render_index(run_prefix: str, sizes: dict[str, int], run: dict | None = None,
                 links: dict[str, str] | None = None) -> str:
    """The index page of one run folder. `sizes` maps keys *relative to the run folder* to bytes."""
    files = {k: v for k, v in sizes.items() if k != INDEX}
    groups: dict[str, list[str]] = {}
    for rel in sorted(files):
        groups.setdefault(rel.split("/", 1)[0] if "/" in rel else "", []).append(rel)
    order = [""] + [s for s in SECTIONS if s in groups] + sorted(g for g in groups if g and g not in SECTIONS)
    reports = [r for r in groups.get("reports", []) if r.endswith((".html", ".md", ".pdf", ".png", ".svg"))]
    title = html.escape(f"rlvr run {run_prefix}")
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>",
           "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}td{padding:0 1em 0 0}"
           "td.n{text-align:right;color:#555}h2{margin-top:1.5em}</style></head><body>", f"<h1>{title}</h1>"]
    if run:
        out.append("<table>" + "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(_fmt(run[k]))}</td></tr>"
                                       for k in _RUN_FIELDS if run.get(k) not in (None, "")) + "</table>")
    if links:
        out.append("<p>" + " · ".join(f'<a href="{html.escape(u)}">{html.escape(name)}</a>'
                                      for name, u in links.items()) + "</p>")
    if reports:
        out.append("<h2>Reports</h2><ul>" + "".join(f"<li>{_link(r)}</li>" for r in reports) + "</ul>")
    for g in order:
        out.append(f"<h2>{html.escape(g + '/') if g else 'Files'}</h2><table>")
        out += [f"<tr><td>{_link(rel)}</td><td class='n'>{_size(files[rel])}</td></tr>" for rel in groups[g]]
        out.append("</table>")
    out.append(f"<p><small>{len(files)} files, {_size(sum(files.values()))}; written "
               f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC</small></p></body></html>\n")
    return "\n".join(out)


def write_run_index(store: ArtifactStore, run_prefix: str, links: dict[str, str] | None = None) -> str:
    """(Re)write `<run_prefix>/index.html` from what the store holds now; returns its key."""
    base = run_prefix.strip("/")
    sizes = {k[len(base) + 1:]: n for k, n in store.sizes(base).items()}
    if not sizes:
        raise FileNotFoundError(f"no run folder {base!r} in {store.uri}")
    run = None
    if "run.json" in sizes:
        try:
            run = json.loads(store.get_text(join(base, "run.json")))
        except (ValueError, OSError):
            run = None  # an index without the header beats no index
    return store.put_text(join(base, INDEX), render_index(base, sizes, run, links))


def view_cache(store: ArtifactStore) -> Path:
    """Where `open` puts copies of remote artifacts: `$RLVR_HOME/cache/artifact-views/<bucket>/<prefix>`."""
    from rlvr_core import settings

    if not isinstance(store, S3Store):
        raise TypeError(f"{store.uri}: only remote stores are copied into the view cache")
    return settings.paths().cache / "artifact-views" / store.bucket / store.prefix


def local_view(store: ArtifactStore, key: str, *, with_checkpoints: bool = False) -> Path:
    """A local path showing `key`: a file, or a run folder's index page.

    Local stores answer with the path in place; S3 keys are downloaded to `view_cache` (a folder is
    copied whole, checkpoints/ only with `with_checkpoints`, so its index's relative links work)."""
    key = key.strip("/")
    is_file = bool(key) and store.exists(key)
    if not is_file and not store.list(key):
        raise FileNotFoundError(f"no artifact or folder {key!r} in {store.uri}")
    if isinstance(store, LocalStore):
        path = store.root / key if key else store.root
    else:
        path = view_cache(store) / key
        if is_file:
            store.get_file(key, path)
        else:
            store.get_dir(key, path, skip=() if with_checkpoints else ("checkpoints/",))
    if path.is_dir() and (path / INDEX).is_file():
        return path / INDEX
    return path


def artifacts_open(
    key: str = typer.Argument("", help="an artifact key or a run folder, e.g. rlvr-demo/RUN_ID"),
    print_only: bool = typer.Option(False, "--print", help="print the local path; do not start a browser"),
    with_checkpoints: bool = typer.Option(False, "--with-checkpoints", help="also download checkpoints/ (S3)"),
    artifact_uri: Optional[str] = typer.Option(None, help="artifact store root (default: RLVR_ARTIFACT_URI)"),
) -> None:
    """Open an artifact or a run folder's index.html (downloaded to a local cache when on S3)."""
    from rlvr_core.storage import open_store

    try:
        path = local_view(open_store(artifact_uri), key, with_checkpoints=with_checkpoints)
    except FileNotFoundError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1)
    typer.echo(str(path))
    if not print_only:
        webbrowser.open(path.resolve().as_uri())


def artifacts_index(
    run: str = typer.Argument(..., help="run folder: EXPERIMENT/RUN_ID"),
    artifact_uri: Optional[str] = typer.Option(None, help="artifact store root (default: RLVR_ARTIFACT_URI)"),
) -> None:
    """(Re)write a run folder's index.html from the files it holds now."""
    from rlvr_core.storage import open_store

    store = open_store(artifact_uri)
    try:
        key = write_run_index(store, run)
    except FileNotFoundError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1)
    typer.echo(store.url(key))
