"""The verdict on a child that died without reporting, judged by its exit status and by the memory cgroup's
OOM-kill counter, read before the child starts (`oom_kill_count`) and after it died.

A kill while the counter went up is the kernel's OOM killer: deterministic (the same batch would run out again),
with the G-oom line saying what to lower. Any other kill (pre-emption, a lost node, Ctrl-C) is transient. A death
without a signal is a crash: deterministic. The counter is cgroup v2 `memory.events` (`oom_kill` plus
`oom_group_kill`) or v1 `memory.oom_control` (`oom_kill`) of this process's cgroup, or the file
`RLVR_OOM_KILL_FILE` names. Fallback: where no counter can be read (no memory cgroup, a node on another host whose
cgroup this process cannot see), a death by SIGKILL cannot be told from pre-emption and is classified by its
signal alone: SIGKILL, SIGTERM, SIGINT and SIGHUP are transient.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

# Signals that mean "someone killed the process" (pre-emption, a lost node, Ctrl-C; the kernel's OOM killer
# sends SIGKILL too, which `classify_death` tells apart by the cgroup's counter).
KILL_SIGNALS = {signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
_OOM_COUNTERS = ("oom_kill", "oom_group_kill")  # v2 memory.events; v1 memory.oom_control has oom_kill only


def oom_kill_count() -> int | None:
    """How many processes the kernel's OOM killer has killed in this process's memory cgroup (`oom_kill` plus
    `oom_group_kill` of cgroup v2 `memory.events`, or `oom_kill` of v1 `memory.oom_control`), or None where no
    such file can be read. `RLVR_OOM_KILL_FILE` names the file instead (a cgroup mounted elsewhere)."""
    for path in oom_counter_files():
        try:
            lines = Path(path).read_text().splitlines()
        except OSError:
            continue
        counts = [int(value) for key, _, value in (line.partition(" ") for line in lines) if key in _OOM_COUNTERS]
        if counts:
            return sum(counts)
    return None


def oom_counter_files() -> list[str]:
    """The files `oom_kill_count` reads, first found first: `RLVR_OOM_KILL_FILE`, else this process's cgroup's."""
    if os.environ.get("RLVR_OOM_KILL_FILE"):
        return [os.environ["RLVR_OOM_KILL_FILE"]]
    try:
        entries = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    files = []
    for entry in entries:  # "<id>:<controllers>:<path>"; v2's one entry has no controllers
        _, controllers, path = entry.split(":", 2)
        if "memory" in controllers.split(","):
            files.append(os.path.normpath(f"/sys/fs/cgroup/memory/{path}/memory.oom_control"))
        elif not controllers:
            files.append(os.path.normpath(f"/sys/fs/cgroup/{path}/memory.events"))
    return files


def killed_by_signal(returncode: int | None) -> bool:
    """Popen gives -N for death by signal N; shells and container runtimes report 128 + N."""
    if returncode is None:
        return False
    if returncode < 0:
        return -returncode in KILL_SIGNALS
    return returncode - 128 in KILL_SIGNALS


@dataclass(frozen=True)
class Death:
    """The verdict on a child that died without reporting. `kind`: "oom" (the kernel's OOM killer), "killed"
    (another kill: transient) or "crashed" (no signal: deterministic); `says`: what the counter showed."""

    kind: str
    transient: bool
    says: str = ""


def classify_death(returncode: int | None, oom_kills_before: int | None, *, relayed: bool = False) -> Death:
    """Judge a child that died without a report. `oom_kills_before`: `oom_kill_count()` read before it started.
    `relayed`: the status is a launcher agent's, which exits with status 1 when one of its ranks is killed, so
    any failure counts as a possible kill (and a lost rank is transient, as a lost node is)."""
    after = oom_kill_count() if oom_kills_before is not None else None
    sigkill = returncode in (-signal.SIGKILL, 128 + signal.SIGKILL) or (relayed and bool(returncode))
    if sigkill and after is not None and after > oom_kills_before:
        return Death("oom", False, f"killed by the kernel's OOM killer (the memory cgroup's oom_kill count went "
                                   f"{oom_kills_before} -> {after})")
    if killed_by_signal(returncode) or (relayed and bool(returncode)):
        return Death("killed", True)
    return Death("crashed", False)
