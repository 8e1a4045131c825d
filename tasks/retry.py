"""Which failures are worth a retry: transient ones (the world hiccupped), not deterministic ones (it would
fail the same way again).

Transient: a lost worker or crashed flow run, a process killed by a signal with no sign of the kernel's
OOM killer (pre-emption, a lost node, Ctrl-C), a dropped connection or timeout, an S3 / HTTP 5xx or
throttling error, a NCCL / gloo collective timeout, the warehouse writer lock timing out. Deterministic:
a bad config, a guard that stopped training, a verifier bug (TypeError, KeyError, …), a missing file, and
out of memory at a batch size that will not shrink by itself: a CUDA or CPU allocation error, or a
SIGKILL while the memory cgroup's `oom_kill` counter went up (`stage_death`). An out-of-memory failure
carries the G-oom line (`oom_guard`) that says which settings to lower. Anything unrecognised is *not*
retried: re-running a bug burns GPU hours and hides the traceback.

Only one layer retries a failure. `retry_condition_fn` is the stage tasks' Prefect hook
(`@task(retry_condition_fn=...)`); `relaunch_condition_fn`, the hook of the tasks that launch whole flow
runs (sweep trials), relaunches only a flow run that crashed, never a failure its stages already retried.
`is_transient` is plain Python (no Prefect import) so the subprocess stage runner classifies its own
failure the same way and hands the verdict to its parent task.
"""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path
from typing import Any

from rlvr_core.experiment.config import ConfigError

# Substrings of messages that mark collective-communication and network timeouts inside generic
# RuntimeErrors (torch.distributed raises DistBackendError/RuntimeError with these texts).
_TRANSIENT_TEXT = (
    "nccl", "watchdog caught collective operation timeout", "connection reset", "connection refused",
    "broken pipe", "timed out", "temporarily unavailable", "gloo", "socket",
)
_OOM_TEXT = ("out of memory", "cublas_status_alloc_failed", "can't allocate memory",  # CUDA; torch's CPU allocator
             "cannot allocate memory")  # ENOMEM
_TRANSIENT_ERRNO = {errno.ECONNRESET, errno.ECONNREFUSED, errno.ECONNABORTED, errno.EPIPE, errno.ETIMEDOUT,
                    errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EAGAIN, errno.EIO}
_S3_TRANSIENT_CODES = {"SlowDown", "RequestTimeout", "RequestTimeTooSkewed", "InternalError", "ServiceUnavailable",
                       "Throttling", "ThrottlingException", "RequestLimitExceeded", "503", "500", "502", "504"}
# Signals that mean "someone killed the process" (pre-emption, a lost node, Ctrl-C; the kernel's OOM killer
# sends SIGKILL too, which `stage_death` tells apart by the cgroup's counter).
KILL_SIGNALS = {signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


class TransientError(RuntimeError):
    """Raised by our own code for a failure known to be transient (a crashed trial flow run, a killed stage)."""


class FlowRunCrashed(TransientError):
    """A launched flow run crashed (its worker was lost): launching it again resumes it (`relaunch_condition_fn`)."""


class DeterministicError(RuntimeError):
    """Raised by our own code for a failure known to repeat (a stage process that failed on a bad input)."""


class StageProcessError(RuntimeError):
    """A stage subprocess ended badly. `transient` is the child's own verdict, or ours from its exit status."""

    def __init__(self, message: str, *, transient: bool, returncode: int | None = None,
                 error_type: str | None = None):
        super().__init__(message)
        self.transient = transient
        self.returncode = returncode
        self.error_type = error_type


def killed_by_signal(returncode: int | None) -> bool:
    """Popen gives -N for death by signal N; shells and container runtimes report 128 + N."""
    if returncode is None:
        return False
    if returncode < 0:
        return -returncode in KILL_SIGNALS
    return returncode - 128 in KILL_SIGNALS


# What to lower when a stage runs out of memory: training's micro-batches and activations (grpo.memory, a section
# declared out of the training folder's key: rlvr_core.experiment.config.grpo_key_dump), its rollout batches and
# lengths; evaluation's generation batches.
_OOM_ADVICE = {
    "train": "lower grpo.memory.micro_batch_size or grpo.memory.max_tokens_per_micro_batch, or set "
             "grpo.memory.gradient_checkpointing=true (training then resumes from its last checkpoint), else lower "
             "grpo.rollout_batch_size or shorten "
             "sampling.max_new_tokens (training starts over)",
    "evaluate": "lower sampling.batch_size or shorten sampling.max_new_tokens",
}


def oom_guard(stage: str) -> str:
    """The line an out-of-memory failure ends with: what to change, since a retry would run out again."""
    return (f"G-oom: the {stage} stage ran out of memory and is not retried (the same batch would run out again): "
            + _OOM_ADVICE.get(stage, _OOM_ADVICE["train"]))


def oom_kill_count() -> int | None:
    """How many processes the kernel's OOM killer has killed in this process's memory cgroup (the `oom_kill`
    line of cgroup v2 `memory.events` or v1 `memory.oom_control`), or None where no such file can be read.
    `RLVR_OOM_KILL_FILE` names the file instead (a cgroup mounted elsewhere)."""
    for path in _oom_counter_files():
        try:
            lines = Path(path).read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
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


def stage_death(stage: str, pid: int, returncode: int | None, oom_kills_before: int | None,
                tail: list[str] = ()) -> StageProcessError:
    """The error for a stage process that died without reporting (`tail`: its last output lines). A SIGKILL
    while the cgroup's OOM-kill count went up is the kernel's OOM killer: deterministic, ending with the G-oom
    line. Any other kill is pre-emption: transient, and the retry resumes. A crash without a signal is
    deterministic."""
    after = oom_kill_count() if oom_kills_before is not None else None
    head = f"{stage} process {pid} exited with status {returncode} without a result"
    output = "".join(f"\n{line}" for line in tail)
    if returncode in (-signal.SIGKILL, 128 + signal.SIGKILL) and after is not None and after > oom_kills_before:
        return StageProcessError(f"{head}: killed by the kernel's OOM killer (the memory cgroup's oom_kill count "
                                 f"went {oom_kills_before} -> {after}){output}\n{oom_guard(stage)}",
                                 transient=False, returncode=returncode, error_type="OOMKilled")
    if killed_by_signal(returncode):
        return StageProcessError(f"{head} (killed by a signal, no OOM kill recorded: transient, a retry "
                                 f"resumes){output}", transient=True, returncode=returncode)
    return StageProcessError(head + output, transient=False, returncode=returncode)


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    if type(exc).__name__ in ("OutOfMemoryError", "OutOfMemoryException"):  # torch.OutOfMemoryError (CUDA)
        return True
    return any(t in str(exc).lower() for t in _OOM_TEXT)


def is_transient(exc: BaseException) -> bool:
    """True for failures a retry can fix; see the module docstring for the lists."""
    if isinstance(exc, StageProcessError):
        return exc.transient
    if type(exc).__name__ == "GroupFailure":  # rlvr_core.pipeline.launch: the launched group's own verdict
        return exc.transient
    if isinstance(exc, TransientError):
        return True
    if isinstance(exc, DeterministicError):
        return False
    if is_oom(exc):  # before RuntimeError: CUDA OOM is a RuntimeError subclass
        return False
    # Our own deterministic errors: configs and training guards.

    if isinstance(exc, ConfigError):
        return False
    if type(exc).__name__ == "GuardError":  # rlvr_core.grpo.trainer.GuardError, without importing torch here
        return False
    # Network and storage.
    if isinstance(exc, (ConnectionError, TimeoutError)):  # ConnectionResetError, BrokenPipeError, socket.timeout
        return True
    if _is_botocore_transient(exc):
        return True
    if _is_http_transient(exc):
        return True
    if isinstance(exc, OSError) and not isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError,
                                                         NotADirectoryError)):
        return exc.errno in _TRANSIENT_ERRNO
    # Collective timeouts (NCCL/gloo) surface as RuntimeError or torch.distributed.DistError subclasses.
    if type(exc).__name__ in ("DistBackendError", "DistNetworkError", "DistStoreError"):
        return True
    if type(exc) is RuntimeError and any(t in str(exc).lower() for t in _TRANSIENT_TEXT):
        return True
    return False


def _is_botocore_transient(exc: BaseException) -> bool:
    try:
        from botocore.exceptions import (ClientError, ConnectionClosedError, EndpointConnectionError,
                                         ReadTimeoutError, ConnectTimeoutError)
    except ImportError:  # pragma: no cover - boto3 is a core dependency
        return False
    if isinstance(exc, (EndpointConnectionError, ConnectionClosedError, ReadTimeoutError, ConnectTimeoutError)):
        return True
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return str(err.get("Code")) in _S3_TRANSIENT_CODES or (isinstance(status, int) and status >= 500)
    return False


def _is_http_transient(exc: BaseException) -> bool:
    """httpx (Prefect's client) and requests (MLflow's): connection errors and 5xx/429 responses."""
    try:
        import httpx
    except ImportError:  # pragma: no cover
        httpx = None
    if httpx is not None:
        if isinstance(exc, (httpx.TransportError,)):
            return True
        if isinstance(exc, httpx.HTTPStatusError):
            return exc.response.status_code >= 500 or exc.response.status_code == 429
    try:
        import requests
    except ImportError:  # pragma: no cover
        return False
    if isinstance(exc, (requests.ConnectionError, requests.Timeout)):
        return True
    if isinstance(exc, requests.HTTPError) and exc.response is not None:
        return exc.response.status_code >= 500 or exc.response.status_code == 429
    return False


def retry_condition_fn(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect's hook for stage tasks: retry only when the failed state's exception is transient."""
    exc = _state_exception(state)
    return isinstance(exc, BaseException) and is_transient(exc)


def relaunch_condition_fn(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect's hook for tasks that launch flow runs (sweep trials): launch again only a run that crashed (its
    worker was lost). A failure inside the run, transient or not, has had its stage task's retries already;
    retrying it here too would multiply them."""
    return isinstance(_state_exception(state), FlowRunCrashed)


def _state_exception(state: Any) -> Any:
    try:
        return state.result(raise_on_failure=False)
    except BaseException as e:  # noqa: BLE001 - the result itself could not be read: look at that error
        return e
