"""Whether this machine can isolate model-written code, and the isolation a caller asked for.

`os` (the default) runs each program under bubblewrap (`bwrap`, Debian's package `bubblewrap`) in new user, PID,
network, IPC, UTS and mount namespaces: it sees only the read-only interpreter and its own scratch folder. Where
bwrap is missing or the host allows no user namespaces, `os` refuses, in one line that says what to do: install
bubblewrap, or opt in to `hook-only` by config, which runs the program with the audit hook alone (no boundary against
code written to escape it: another item's files, the data on disk and other processes stay within its reach).
"""

from __future__ import annotations

import shutil
import subprocess
from functools import lru_cache

ISOLATIONS = ("os", "hook-only")
# bwrap's own environment: its init process (PID 1 of the sandbox) keeps it, and the program can read its
# /proc/1/environ, so the caller's variables (credentials among them) never reach bwrap.
BWRAP_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
INSTALL_HINT = ("install bubblewrap (`apt-get install bubblewrap`; `make test` does) or opt in to the audit hook "
                "alone with the option isolation: hook-only")


class SandboxUnavailable(RuntimeError):
    """The configured isolation cannot be had on this machine; nothing was run."""


@lru_cache(maxsize=1)
def bwrap_exe() -> str | None:
    """bwrap as the caller's PATH finds it."""
    return shutil.which("bwrap")


@lru_cache(maxsize=1)
def bwrap_features() -> frozenset[str] | None:
    """The optional bwrap flags this version knows (`--disable-userns`, `--size`), or None when bwrap cannot
    start a sandbox here."""
    return None if bwrap_problem() else _features()


def _features() -> frozenset[str]:
    out = subprocess.run([str(bwrap_exe()), "--help"], capture_output=True, text=True, env=BWRAP_ENV, timeout=10)
    return frozenset(flag for flag in ("--disable-userns", "--size") if flag in out.stdout + out.stderr)


@lru_cache(maxsize=1)
def bwrap_problem() -> str | None:
    """None when bwrap starts a process in new user, PID and network namespaces here; else why not, in one line."""
    exe = bwrap_exe()
    if exe is None:
        return "bubblewrap (bwrap) is not installed"
    cmd = [exe, "--unshare-user", "--unshare-pid", "--unshare-net", "--ro-bind", "/", "/", "true"]
    try:
        probe = subprocess.run(cmd, capture_output=True, text=True, env=BWRAP_ENV, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap did not start: {exc}"
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or [f"exit status {probe.returncode}"])[-1]
        return f"bwrap cannot create namespaces here ({why})"
    return None


def check_isolation(isolation: str) -> None:
    """Raise ValueError for an unknown isolation, SandboxUnavailable when `os` cannot be had here."""
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {', '.join(ISOLATIONS)}, got {isolation!r}")
    if isolation == "os" and (why := bwrap_problem()) is not None:
        raise SandboxUnavailable(f"refusing to run model-written code without OS isolation: {why}; {INSTALL_HINT}")
