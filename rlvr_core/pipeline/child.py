"""One protocol for every child process the pipeline starts: a stage child (`tasks/stage_process.py` starts
`tasks/stage_runner.py`) and the nodes of a launched training group (`rlvr_core/pipeline/launch.py` starts
`rlvr_core/pipeline/rank.py` under torchrun or DeepSpeed's launcher).

* Sealed request (`write_request`, `read_request`): the request file holds no secret; its secrets are sealed
  (`rlvr_core.experiment.secrets`) and travel in the child's environment. The file is private (0600).
* Parent watch (`watch_parent`): a child exits (status 137) when whoever started it is gone, so no orphan keeps
  writing checkpoints into the folder a retry is about to resume from.
* Death classification (`classify_death`): a child that died without reporting is judged by its exit status
  and by the memory cgroup's OOM-kill counter, read before the child starts (`oom_kill_count`) and after it
  died. A kill while the counter went up is the kernel's OOM killer: deterministic (the same batch would run out
  again), with the G-oom line (`oom_guard`) saying what to lower. Any other kill (pre-emption, a lost node,
  Ctrl-C) is transient. The counter is cgroup v2 `memory.events` (`oom_kill` plus `oom_group_kill`) or v1
  `memory.oom_control` (`oom_kill`) of this process's cgroup, or the file `RLVR_OOM_KILL_FILE` names.
  Fallback: where no counter can be read (no memory cgroup, a node on another host whose cgroup this process
  cannot see), a death by SIGKILL cannot be told from pre-emption and is classified by its signal alone:
  SIGKILL, SIGTERM, SIGINT and SIGHUP are transient.

`tasks/retry.py` decides every retry with these (its `stage_death` and G-oom rule call them), so a stage and a
launched group classify the same kill the same way. Plain Python: no Prefect, no torch.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr_core.experiment.secrets import seal, unseal

# Signals that mean "someone killed the process" (pre-emption, a lost node, Ctrl-C; the kernel's OOM killer
# sends SIGKILL too, which `classify_death` tells apart by the cgroup's counter).
KILL_SIGNALS = {signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
_OOM_TEXT = ("out of memory", "cublas_status_alloc_failed", "can't allocate memory",  # CUDA; torch's CPU allocator
             "cannot allocate memory")  # ENOMEM
_OOM_COUNTERS = ("oom_kill", "oom_group_kill")  # v2 memory.events; v1 memory.oom_control has oom_kill only
GUARD_PREFIX = "G-oom:"

# What to lower when a stage runs out of memory: training's micro-batches and activations (grpo.memory, a section
# declared out of the training folder's key: rlvr_core.experiment.grpo_config.grpo_key_dump), its rollout batches
# and lengths; evaluation's generation batches.
_OOM_ADVICE = {
    "train": "lower grpo.memory.micro_batch_size or grpo.memory.max_tokens_per_micro_batch, or set "
             "grpo.memory.gradient_checkpointing=true (training then resumes from its last checkpoint), else lower "
             "grpo.rollout_batch_size or shorten sampling.max_new_tokens (training starts over)",
    "evaluate": "lower sampling.batch_size or shorten sampling.max_new_tokens",
}


# ---------------------------------------------------------------------------- sealed request
def write_request(path: Path, request: dict[str, Any]) -> dict[str, str]:
    """Write the sealed request, readable by its owner only; return the secrets it left out, by variable name
    (the child's environment carries them)."""
    sealed, secrets = seal(request)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        f.write(json.dumps(sealed, default=str))
    return secrets


def read_request(path: Path, *, delete: bool) -> dict[str, Any]:
    """The request with its secrets filled in from this process's environment. `delete`: remove the file once
    read (a stage child, its only reader), so none is left behind even if this process is killed."""
    text = path.read_text()
    if delete:
        path.unlink(missing_ok=True)
    return unseal(json.loads(text), str(path))


# ---------------------------------------------------------------------------- parent watch
def watch_parent(launcher_pid: int | None = None, interval_s: float = 0.2) -> None:
    """Exit with status 137 when this process's parent changes (it died: we were re-parented), or when
    `launcher_pid` is gone. A rank passes the stage process that launched its group: torchrun starts each rank
    in a session of its own, so killing the agent's process group would leave the rank training on."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(137)
            if launcher_pid is not None:
                try:
                    os.kill(launcher_pid, 0)
                except ProcessLookupError:
                    os._exit(137)
            time.sleep(interval_s)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


# ---------------------------------------------------------------------------- death classification
def oom_kill_count() -> int | None:
    """How many processes the kernel's OOM killer has killed in this process's memory cgroup (`oom_kill` plus
    `oom_group_kill` of cgroup v2 `memory.events`, or `oom_kill` of v1 `memory.oom_control`), or None where no
    such file can be read. `RLVR_OOM_KILL_FILE` names the file instead (a cgroup mounted elsewhere)."""
    for path in _oom_counter_files():
        try:
            lines = Path(path).read_text().splitlines()
        except OSError:
            continue
        counts = [int(value) for key, _, value in (line.partition(" ") for line in lines) if key in _OOM_COUNTERS]
        if counts:
            return sum(counts)
    return None


def _oom_counter_files() -> list[str]:
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


def is_oom(exc: BaseException) -> bool:
    """An allocation failure: MemoryError, torch's (CUDA) OutOfMemoryError, or an allocator's message."""
    if isinstance(exc, MemoryError):
        return True
    if type(exc).__name__ in ("OutOfMemoryError", "OutOfMemoryException"):  # torch.OutOfMemoryError (CUDA)
        return True
    return any(t in str(exc).lower() for t in _OOM_TEXT)


def oom_guard(stage: str) -> str:
    """The line an out-of-memory failure ends with: what to change, since a retry would run out again."""
    return (f"{GUARD_PREFIX} the {stage} stage ran out of memory and is not retried (the same batch would run out "
            "again): " + _OOM_ADVICE.get(stage, _OOM_ADVICE["train"]))


def needs_oom_guard(exc: BaseException) -> bool:
    """Out of memory and not yet carrying the G-oom line (a launched group's failure already does)."""
    return is_oom(exc) and GUARD_PREFIX not in str(exc)
