"""What `rlvr artifacts open|ls|get` are given, found in the artifact store: every form rlvr prints.

    s3://BUCKET/KEY[/]           an object or a folder (the `artifacts:` line of `rlvr demo` and of a sweep)
    /PATH[/], file:///PATH       a file or folder on disk (the same lines with a local store)
    EXPERIMENT/FOLDER[/KEY]      a key or folder of the configured store
    FOLDER                       a run's or sweep's folder name in any experiment: a sweep id (`demo-lr-40e69213`,
                                 what `rlvr sweep` prints), `demo-1a2b3c4d`; a Prefect flow run id finds the sweep
                                 whose id ends in its first 8 characters
    RUN_ID                       a run id, full or its first 8 characters, found by the run folders' run.json
    MLFLOW_RUN_ID, MLflow URL    looked up in the MLflow tracking store (MLFLOW_TRACKING_URI, or the URL's
                                 server): a sweep's parent run gives the sweep's folder, a stage run its parent's,
                                 a trial its folder inside the sweep
    MLflow view URL              the sweep's compare view (`MLflow compare view:` of `rlvr sweep`,
                                 `…/runs?…viewStateShareKey=sweep-<sweep id>…`): the sweep's folder

`locate` answers a `Located` (store, key, file or folder, and which form matched) or raises `NotFound`: one
line saying what was tried. `folder_groups` is `rlvr artifacts ls`: keys grouped by run or sweep folder.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator
from urllib.parse import parse_qs, urlsplit

from rlvr_core.artifacts.layout import RUN_FILE, resolve_run, run_prefix, sweep_prefix
from rlvr_core.artifacts.storage import ArtifactStore, LocalStore, S3Store, join
from rlvr_core.core import settings
from rlvr_core.records.redact import redact_url

_HEX32 = re.compile(r"[0-9a-f]{32}")
_MLFLOW_RUN_URL = re.compile(r"/runs/([0-9a-f]{32})\b")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
TRIED = "a key, a folder, a run or sweep folder name and a run id"


class NotFound(FileNotFoundError):
    """Nothing in the store answers to what was given; the message says what was tried."""


@dataclass(frozen=True)
class Located:
    store: ArtifactStore
    key: str  # relative to the store's root; "" is the root itself
    is_file: bool
    form: str  # which form matched: "s3 URI", "path", "key", "folder", "folder name", "run id", "MLflow run id"

    @property
    def url(self) -> str:
        return self.store.url(self.key) if self.key else self.store.uri


def locate(ref: str, store: ArtifactStore, tracking_uri: str | None = None) -> Located:
    """`ref` in any form rlvr prints (module docstring), in `store` unless it names another place itself."""
    ref = ref.strip()
    if ref.startswith("s3://"):
        return _in_s3(ref, store)
    if ref.startswith(("file://", "/", "~", "./", "../")):
        return _on_disk(ref, store)
    sweep_id = _sweep_of_view_url(ref)
    if sweep_id is not None:
        hit = _in_store(sweep_id, store)
        if hit is None:
            raise NotFound(f"no folder of sweep {sweep_id!r} (from the MLflow view URL) in {store.uri}")
        return hit
    # A full run id: the folder names first, then MLflow (a request or two), and only then every trial's run.json
    # (a request per trial on S3: ~10 s on a stack with a few sweeps).
    full_id = bool(_HEX32.fullmatch(ref.lower()))
    hit = _in_store(ref, store, read_trials=not full_id)
    if hit is None and ref and Path(ref).exists():
        hit = _on_disk(ref, store)
    if hit is not None:
        return hit
    hit, why = _by_mlflow(ref, store, tracking_uri)
    if hit is None and full_id:
        hit = _in_store(ref, store)
    if hit is not None:
        return hit
    raise NotFound(f"no artifact, folder or run {ref!r} in {store.uri}: tried {TRIED}" + (f"; {why}" if why else ""))


def _sweep_of_view_url(ref: str) -> str | None:
    """The sweep id of an MLflow saved-view URL of a sweep (Tracker.view_url of `sweep-<sweep id>`), else None."""
    if not ref.startswith(("http://", "https://")) or "viewStateShareKey=" not in ref:
        return None
    query = urlsplit(ref).fragment.partition("?")[2] or urlsplit(ref).query
    view = parse_qs(query).get("viewStateShareKey", [""])[0]
    return view[len("sweep-"):] if view.startswith("sweep-") and len(view) > len("sweep-") else None


def _found(store: ArtifactStore, key: str, form: str) -> Located | None:
    """`key` as a file or a non-empty folder of `store`, else None."""
    if key and store.exists(key):
        return Located(store, key, True, form)
    return Located(store, key, False, form) if store.list(key) else None


def _valid_key(key: str) -> bool:
    return all(p not in ("", ".", "..") for p in key.split("/"))


def _in_s3(ref: str, store: ArtifactStore) -> Located:
    """An s3:// URI: relative to `store` when it lies inside it (same bucket, under its prefix), else in its
    bucket on the same S3 endpoint."""
    parts = urlsplit(ref)
    path = parts.path.strip("/")
    if not parts.netloc or (path and not _valid_key(path)):
        raise NotFound(f"{ref!r}: not an S3 URI of an artifact (s3://BUCKET/KEY)")
    if isinstance(store, S3Store) and store.bucket == parts.netloc and (
            not store.prefix or path == store.prefix or path.startswith(store.prefix + "/")):
        target, key = store, path[len(store.prefix):].strip("/")
    else:
        endpoint = store.endpoint_url if isinstance(store, S3Store) else settings.s3_endpoint_url()
        target, key = S3Store(parts.netloc, "", endpoint), path
    hit = _found(target, key, "s3 URI")
    if hit is None:
        raise NotFound(f"no object or folder {ref!r} (S3 at {getattr(target.client.meta, 'endpoint_url', 'AWS')})")
    return hit


def _on_disk(ref: str, store: ArtifactStore) -> Located:
    """A local file or folder: relative to `store` when it lies inside its folder."""
    p = Path(urlsplit(ref).path if ref.startswith("file://") else ref).expanduser().resolve()
    if not p.exists():
        raise NotFound(f"no file or folder {str(p)!r}")
    if isinstance(store, LocalStore) and p.is_relative_to(store.root):
        rel = p.relative_to(store.root).as_posix()
        return Located(store, "" if rel == "." else rel, p.is_file(), "path")
    if p.is_file():
        return Located(LocalStore(p.parent), p.name, True, "path")
    return Located(LocalStore(p), "", False, "path")


def _in_store(ref: str, store: ArtifactStore, read_trials: bool = True) -> Located | None:
    """A key, a folder, a folder's name in any experiment (a sweep id), or a run id; None when none matches."""
    key = ref.strip("/")
    if not key:
        return Located(store, "", False, "folder")
    if not _valid_key(key):
        return None
    hit = _found(store, key, "key")
    if hit is not None:
        return hit if hit.is_file else Located(store, key, False, "folder")
    if "/" not in key:
        names = [join(exp, name) for exp in store.folders() for name in store.folders(exp)
                 if name == key or (_UUID.fullmatch(key) and name.endswith("-" + key[:8]))]
        if len(names) > 1:
            raise NotFound(f"{ref!r} is ambiguous in {store.uri}: {', '.join(names)}")
        if names:
            return Located(store, names[0], False, "folder name")
    try:
        return Located(store, resolve_run(store, key, read_trials), False, "run id")
    except FileNotFoundError as e:
        if "ambiguous" in str(e):
            raise NotFound(str(e)) from None
    return None


# ---------------------------------------------------------------------------------------------- MLflow
@contextlib.contextmanager
def _quick_mlflow() -> Iterator[None]:
    """A lookup that fails in seconds when the tracking server is down (MLflow retries for minutes)."""
    quick = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
    old = {k: os.environ.get(k) for k in quick}
    os.environ.update(quick)
    try:
        yield
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def _mlflow_ref(ref: str, tracking_uri: str | None) -> tuple[str, str] | None:
    """(run id, tracking URI) when `ref` is an MLflow run id or a run's page on a tracking server."""
    if _HEX32.fullmatch(ref.lower()):
        return ref.lower(), settings.mlflow_tracking_uri(tracking_uri)
    m = _MLFLOW_RUN_URL.search(ref) if ref.startswith(("http://", "https://")) else None
    if m:
        parts = urlsplit(ref)
        return m.group(1), f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"
    return None


def _by_mlflow(ref: str, store: ArtifactStore, tracking_uri: str | None) -> tuple[Located | None, str]:
    """The run's folder, found through its MLflow run's tags; (None, why) when that finds nothing."""
    found = _mlflow_ref(ref, tracking_uri)
    if found is None:
        return None, ""
    run_id, uri = found
    where = f"as an MLflow run id in {redact_url(uri)}"
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        return None, f"{where}: no such store"
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        with _quick_mlflow():
            client = MlflowClient(tracking_uri=uri)
            run = client.get_run(run_id)
            for _ in range(3):  # a stage run: its parent (the demo, pipeline or trial run) has the folder
                parent = run.data.tags.get("mlflow.parentRunId")
                if run.data.tags.get("kind") != "stage" or not parent:
                    break
                run = client.get_run(parent)
            experiment = client.get_experiment(run.info.experiment_id).name
    except MlflowException as e:
        missing = getattr(e, "error_code", "") == "RESOURCE_DOES_NOT_EXIST"
        return None, f"{where}: " + ("no such run" if missing else str(e).strip().splitlines()[0][:300])
    for key in _mlflow_folders(store, experiment, run):
        hit = _found(store, key, "MLflow run id")
        if hit is not None:
            return hit, ""
    return None, f"{where}: run {run.info.run_name!r} of experiment {experiment!r} has no folder in {store.uri}"


def _mlflow_folders(store: ArtifactStore, experiment: str, run) -> list[str]:
    """Where the run's folder can be (rlvr_core.artifacts.layout): a sweep's, a trial's inside its sweep, a
    run's `<experiment>/<name>-<id[:8]>`, or wherever its run.json says."""
    tags, run_id = run.data.tags, run.info.run_id
    if tags.get("kind") == "sweep" and tags.get("sweep_id"):
        return [sweep_prefix(experiment, tags["sweep_id"])]
    if tags.get("sweep_id") and tags.get("trial_id"):
        sweep = sweep_prefix(experiment, tags["sweep_id"])
        return [join(sweep, f) for f in store.folders(sweep) if f == tags["trial_id"] or
                f.startswith(tags["trial_id"] + "_")]
    try:
        return [resolve_run(store, run_id)]
    except FileNotFoundError:
        return [run_prefix(experiment, run.info.run_name, run_id)]


# ---------------------------------------------------------------------------------------------- ls
def folder_groups(sizes: dict[str, int]) -> list[dict]:
    """Keys grouped by the run folder holding them (a folder with run.json, innermost), else by their
    `<experiment>/<folder>` (a sweep's own files: index.html, pivot.json; a trial's without run.json yet:
    `<experiment>/<sweep>/<trial>`). Each group: folder, kind (run, sweep or folder), files, bytes, keys."""
    runs = {k.rsplit("/", 1)[0] for k in sizes if k.endswith("/" + RUN_FILE)}
    holders = {r.rsplit("/", 1)[0] for r in runs if r.count("/") >= 2}  # sweep folders (they hold trials)
    groups: dict[str, dict] = {}
    for key in sorted(sizes):
        parts = key.split("/")
        owner = next((f for f in ("/".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)) if f in runs), None)
        if owner is None:
            owner = "/".join(parts[:min(2, len(parts) - 1)])
            if owner in holders and len(parts) > 3:
                owner = "/".join(parts[:3])
        kind = "run" if owner in runs else "sweep" if owner in holders or join(owner, "pivot.json") in sizes \
            else "folder"
        g = groups.setdefault(owner, {"folder": owner, "kind": kind, "files": 0, "bytes": 0, "keys": []})
        g["files"] += 1
        g["bytes"] += sizes[key]
        g["keys"].append(key)
    return list(groups.values())
