"""Content-addressed stage outputs: the same inputs give the same folder, built once.

A stage that is a pure function of its inputs (make data, warm-start the base model, a pass-rate
table) writes into `$RLVR_HOME/cache/<stage>/<hash of inputs>/`. The folder is built under a temporary
name and renamed into place only when complete, with a `.done` marker, so a crash mid-build never
leaves a half-written entry that a later run would trust.

Stages on workers that share no disk: with `RLVR_STAGE_STORE` (an artifact store URI, e.g.
`s3://bucket/stage-cache`) every finished folder is also uploaded there under `<stage>/<hash>/` (its
`.done` last), and a folder missing here is fetched from there before anything is built. An artifact
that names a folder of another worker's cache (`.../cache/<stage>/<hash>/...`) is found here by
`localize`, so two workers with different `RLVR_HOME`s hand stage outputs over through the store alone.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

from rlvr_core.artifacts.storage import open_store
from rlvr_core.core import settings
from rlvr_core.experiment.config import config_hash

DONE = ".done"
STAGE_STORE_ENV = "RLVR_STAGE_STORE"


def key_hash(key: dict[str, Any]) -> str:
    return config_hash(key)[:20]


def cached_dir(stage: str, key: dict[str, Any], build: Callable[[Path], Any],
               root: Path | None = None) -> tuple[Path, bool]:
    """Return (folder, hit). On a miss, `build(tmp_folder)` fills a fresh folder that then moves in place."""
    base = (root or settings.paths().cache) / stage
    final = base / key_hash(key)
    if (final / DONE).exists() or fetch(stage, final):
        return final, True
    tmp = base / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        build(tmp)
        (tmp / "cache_key.json").write_text(json.dumps(key, indent=2, sort_keys=True))
        (tmp / DONE).write_text("")
        if final.exists():  # a stale, incomplete entry (no .done), or another process won the race
            if (final / DONE).exists():
                shutil.rmtree(tmp)
                return final, False
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    publish(final)
    return final, False


def resumable_path(stage: str, key: dict[str, Any], root: Path | None = None) -> Path:
    """Where `resumable_dir` keeps the stage with inputs `key` (not created here)."""
    return (root or settings.paths().cache) / stage / key_hash(key)


def resumable_dir(stage: str, key: dict[str, Any], root: Path | None = None) -> tuple[Path, bool]:
    """(folder, done) for a stage that checkpoints as it goes (training).

    Unlike `cached_dir` the folder is used in place: the same inputs always map to the same folder, so a
    killed or retried stage finds its own checkpoints there and resumes instead of starting over. The
    stage calls `mark_done` when its output is complete; until then nobody treats the folder as a result.
    """
    folder = resumable_path(stage, key, root)
    if not (folder / DONE).exists():
        fetch(stage, folder)
    folder.mkdir(parents=True, exist_ok=True)
    key_file = folder / "cache_key.json"
    if not key_file.exists():
        key_file.write_text(json.dumps(key, indent=2, sort_keys=True))
    return folder, (folder / DONE).exists()


def mark_done(folder: Path) -> None:
    (folder / DONE).write_text("")
    publish(folder)


# ------------------------------------------------------------------------------ the shared stage store
def stage_store():
    """The store finished stage folders are shared through (`RLVR_STAGE_STORE`), or None (this disk only)."""
    uri = os.environ.get(STAGE_STORE_ENV)
    return open_store(uri) if uri else None


def publish(folder: Path) -> None:
    """Upload a finished folder to the stage store (no-op without one): every file, then `.done`, so a worker
    that sees `.done` there finds the whole folder."""
    store = stage_store()
    if store is None:
        return
    prefix = f"{folder.parent.name}/{folder.name}"
    for f in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != DONE):
        store.put_file(f"{prefix}/{f.relative_to(folder).as_posix()}", f)
    store.put_bytes(f"{prefix}/{DONE}", b"")


def fetch(stage: str, final: Path) -> bool:
    """Copy `<stage>/<final.name>/` from the stage store into `final` if it is finished there; True if it was."""
    store = stage_store()
    prefix = f"{stage}/{final.name}"
    if store is None or not store.exists(f"{prefix}/{DONE}"):
        return False
    tmp = final.parent / f".fetch-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        store.get_dir(prefix, tmp)
        if final.exists():  # a local, unfinished attempt: the finished folder replaces it
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return True


def localize(path: str) -> str:
    """`path` if it exists here or names no stage output; else, for a file or folder in another home's stage
    cache (`.../cache/<stage>/<hash>[/rest]`), the same one in this home's cache, fetched from the stage store if
    needed. Raises FileNotFoundError naming the path when neither has it."""
    p = Path(path)
    parts = p.parts
    at = max((i for i, part in enumerate(parts[:-2]) if part == "cache"), default=None)
    if p.exists() or at is None:  # here, or not a stage output: the stage reading it reports a missing file
        return path
    stage, name, rest = parts[at + 1], parts[at + 2], parts[at + 3:]
    final = settings.paths().cache / stage / name
    if (final / DONE).exists() or fetch(stage, final):
        return str(final.joinpath(*rest))
    where = f" nor in the stage store {os.environ[STAGE_STORE_ENV]}" if os.environ.get(STAGE_STORE_ENV) else \
        f" (no stage store: set {STAGE_STORE_ENV} to share stage outputs between workers)"
    raise FileNotFoundError(f"{path} is not on this worker{where}")
