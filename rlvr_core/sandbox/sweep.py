"""Remove what crashed earlier runs left in the temp root: hook-only items' folders (`rlvr-sandbox-<pid>-*`) whose
starting process is gone, and the code verifier's folders from before the OS sandbox (`rlvr-code-*`, which held a
solution's scratch, its tests and its nonce) once they are an hour old. OS-isolated items keep no folder on the
host. VerifierPool sweeps at its start and after it kills a worker."""

from __future__ import annotations

import os
import shutil
import tempfile
import time

from rlvr_core.sandbox.process import PRIVATE_PREFIX

_LEGACY_PREFIX = "rlvr-code-"
_LEGACY_AGE_S = 3600.0


def _alive(pid: int) -> bool:
    """The process runs (a zombie, killed and not yet reaped by its parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc here: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # another user's live process
            return True
        return True
    return stat[stat.rfind(b")") + 2:][:1] not in (b"Z", b"X")


def _stale(entry: os.DirEntry, now: float) -> bool:
    if entry.name.startswith(PRIVATE_PREFIX):
        pid = entry.name[len(PRIVATE_PREFIX):].split("-", 1)[0]
        return pid.isdigit() and not _alive(int(pid))
    if entry.name.startswith(_LEGACY_PREFIX):
        return now - entry.stat(follow_symlinks=False).st_mtime > _LEGACY_AGE_S
    return False


def sweep_stale(root: str | None = None) -> list[str]:
    """Remove the stale sandbox folders under `root` (the temp root by default); return their paths."""
    root = root or tempfile.gettempdir()
    removed, now = [], time.time()
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False) and _stale(entry, now):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.path)
        except OSError:
            continue
    return removed
