"""Which failures are worth a retry: transient ones (the world hiccupped), not deterministic ones (it would
fail the same way again).

Transient: a lost worker or crashed flow run, a process killed by a signal with no sign of the kernel's
OOM killer (pre-emption, a lost node, Ctrl-C), a dropped connection or timeout, an S3 / HTTP 5xx or
throttling error, a NCCL / gloo collective timeout, the warehouse writer lock timing out. Deterministic:
a bad config, a guard that stopped training, a verifier bug (TypeError, KeyError, …), a missing file, and
out of memory at a batch size that will not shrink by itself: a CUDA or CPU allocation error, or a
SIGKILL while the memory cgroup's `oom_kill` counter went up (`stage_death`). An out-of-memory failure
carries the G-oom line (`oom_guard`) that says which settings to lower. The kill and out-of-memory rules are
`rlvr_core.pipeline.child`'s (`classify_death`, `is_oom`), the one place that decides them for a stage child and
for a launched training group alike. Anything unrecognised is *not*
retried: re-running a bug burns GPU hours and hides the traceback.

Only one layer retries a failure. `retry_condition_fn` is the stage tasks' Prefect hook
(`@task(retry_condition_fn=...)`); `relaunch_condition_fn`, the hook of the tasks that launch whole flow
runs (sweep trials), relaunches only a flow run that crashed, never a failure its stages already retried.
`is_transient` is plain Python (no Prefect import) so the subprocess stage runner classifies its own
failure the same way and hands the verdict to its parent task.
"""

from __future__ import annotations

import errno
from typing import Any

from rlvr_core.experiment.config import ConfigError
# The death classification and the G-oom rule live with the child protocol, shared with the multi-node launcher;
# re-exported here for the stage tasks and flows.
from rlvr_core.pipeline.child import (KILL_SIGNALS, _oom_counter_files, classify_death, is_oom,  # noqa: F401
                                      killed_by_signal, oom_guard, oom_kill_count)

# Substrings of messages that mark collective-communication and network timeouts inside generic
# RuntimeErrors (torch.distributed raises DistBackendError/RuntimeError with these texts).
_TRANSIENT_TEXT = (
    "nccl", "watchdog caught collective operation timeout", "connection reset", "connection refused",
    "broken pipe", "timed out", "temporarily unavailable", "gloo", "socket",
)
_TRANSIENT_ERRNO = {errno.ECONNRESET, errno.ECONNREFUSED, errno.ECONNABORTED, errno.EPIPE, errno.ETIMEDOUT,
                    errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EAGAIN, errno.EIO}
_S3_TRANSIENT_CODES = {"SlowDown", "RequestTimeout", "RequestTimeTooSkewed", "InternalError", "ServiceUnavailable",
                       "Throttling", "ThrottlingException", "RequestLimitExceeded", "503", "500", "502", "504"}


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


def stage_death(stage: str, pid: int, returncode: int | None, oom_kills_before: int | None,
                tail: list[str] = ()) -> StageProcessError:
    """The error for a stage process that died without reporting (`tail`: its last output lines), judged by
    `rlvr_core.pipeline.child.classify_death`: a SIGKILL while the cgroup's OOM-kill count went up is the kernel's
    OOM killer, deterministic and ending with the G-oom line; any other kill is pre-emption, transient (the retry
    resumes); a crash without a signal is deterministic."""
    death = classify_death(returncode, oom_kills_before)
    head = f"{stage} process {pid} exited with status {returncode} without a result"
    output = "".join(f"\n{line}" for line in tail)
    if death.kind == "oom":
        return StageProcessError(f"{head}: {death.says}{output}\n{oom_guard(stage)}", transient=False,
                                 returncode=returncode, error_type="OOMKilled")
    if death.transient:
        return StageProcessError(f"{head} (killed by a signal, no OOM kill recorded: transient, a retry "
                                 f"resumes){output}", transient=True, returncode=returncode)
    return StageProcessError(head + output, transient=False, returncode=returncode)


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
