"""Content-addressed stage outputs: the same inputs give the same folder, built once.

A stage that is a pure function of its inputs (make data, warm-start the base model, a pass-rate
table) writes into `$RLVR_HOME/cache/<stage>/<hash of inputs>/`. The folder is built under a temporary
name and renamed into place only when complete, with a `.done` marker, so a crash mid-build never
leaves a half-written entry that a later run would trust.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

from rlvr_core.core import settings
from rlvr_core.experiment.config import config_hash

DONE = ".done"


def key_hash(key: dict[str, Any]) -> str:
    return config_hash(key)[:20]


def cached_dir(stage: str, key: dict[str, Any], build: Callable[[Path], Any],
               root: Path | None = None) -> tuple[Path, bool]:
    """Return (folder, hit). On a miss, `build(tmp_folder)` fills a fresh folder that then moves in place."""
    base = (root or settings.paths().cache) / stage
    final = base / key_hash(key)
    if (final / DONE).exists():
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
    folder.mkdir(parents=True, exist_ok=True)
    key_file = folder / "cache_key.json"
    if not key_file.exists():
        key_file.write_text(json.dumps(key, indent=2, sort_keys=True))
    return folder, (folder / DONE).exists()


def mark_done(folder: Path) -> None:
    (folder / DONE).write_text("")
