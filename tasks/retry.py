"""Which failures are worth a retry: transient ones (the world hiccupped), not deterministic ones (it would
fail the same way again).

Transient: a lost worker or crashed flow run, a process killed by a signal, a dropped connection or
timeout, an S3 / HTTP 5xx or throttling error, a NCCL / gloo collective timeout, the warehouse writer
lock timing out. Deterministic: a bad config, a guard that stopped training, a verifier bug (TypeError,
KeyError, …), an out-of-memory error at a batch size that will not shrink by itself, a missing file.
Anything unrecognised is *not* retried: re-running a bug burns GPU hours and hides the traceback.

`retry_condition_fn` is the Prefect hook (`@task(retry_condition_fn=...)`); `is_transient` is plain
Python (no Prefect import) so the subprocess stage runner classifies its own failure the same way and
hands the verdict to its parent task.
"""

from __future__ import annotations

import errno
import signal
from typing import Any

from rlvr_core.experiment.config import ConfigError

# Substrings of messages that mark collective-communication and network timeouts inside generic
# RuntimeErrors (torch.distributed raises DistBackendError/RuntimeError with these texts).
_TRANSIENT_TEXT = (
    "nccl", "watchdog caught collective operation timeout", "connection reset", "connection refused",
    "broken pipe", "timed out", "temporarily unavailable", "gloo", "socket",
)
_OOM_TEXT = ("out of memory", "cuda error: out of memory", "cublas_status_alloc_failed")
_TRANSIENT_ERRNO = {errno.ECONNRESET, errno.ECONNREFUSED, errno.ECONNABORTED, errno.EPIPE, errno.ETIMEDOUT,
                    errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EAGAIN, errno.EIO}
_S3_TRANSIENT_CODES = {"SlowDown", "RequestTimeout", "RequestTimeTooSkewed", "InternalError", "ServiceUnavailable",
                       "Throttling", "ThrottlingException", "RequestLimitExceeded", "503", "500", "502", "504"}
# Signals that mean "someone killed the process" (pre-emption, a lost node, the OOM killer, Ctrl-C).
KILL_SIGNALS = {signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


class TransientError(RuntimeError):
    """Raised by our own code for a failure known to be transient (a crashed trial flow run, a killed stage)."""


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
    """Prefect's hook: retry only when the failed state's exception is transient."""
    try:
        exc = state.result(raise_on_failure=False)
    except BaseException as e:  # noqa: BLE001 - the result itself could not be read: look at that error
        exc = e
    return isinstance(exc, BaseException) and is_transient(exc)
