"""Which failures are worth a retry: transient ones (the world hiccupped), not deterministic ones (it would
fail the same way again). The one rule: a stage child and a rank judge their own failure with it (a rank whose
error only says its peers went away also reports it as kind "peer_lost": `child.rank`), the stage tasks' Prefect
hook (`tasks.retry.retry_condition_fn`) judges what reaches it with it.

Transient: a lost worker or crashed flow run, a process killed by a signal with no sign of the kernel's OOM
killer (pre-emption, a lost node, Ctrl-C), a dropped connection or timeout, an S3 / HTTP 5xx or throttling error,
a NCCL / gloo collective timeout, the warehouse writer lock timing out. Deterministic: a bad config, a guard that
stopped training, a verifier bug (TypeError, KeyError, ...), a missing file, and out of memory at a batch size
that will not shrink by itself: a CUDA or CPU allocation error, or a SIGKILL while the memory cgroup's `oom_kill`
counter went up (`death.classify_death`). An out-of-memory failure carries the G-oom line (`oom_guard`) that says
which settings to lower. Anything unrecognised is *not* retried: re-running a bug burns GPU hours and hides the
traceback. Plain Python: torch's own exception classes are matched only when torch is already loaded (a
torch exception cannot exist otherwise).
"""

from __future__ import annotations

import errno
import sys

from rlvr_core.experiment.config import ConfigError
from rlvr_core.experiment.guards import GuardError
from rlvr_core.pipeline.child.errors import ChildError, DeterministicError, OutOfMemory, TransientError

GUARD_PREFIX = "G-oom:"
_OOM_TEXT = ("out of memory", "cublas_status_alloc_failed", "can't allocate memory",  # CUDA; torch's CPU allocator
             "cannot allocate memory")  # ENOMEM
# What to lower when a stage runs out of memory: training's micro-batches and activations (grpo.memory, a section
# declared out of the training folder's key: rlvr_core.experiment.grpo_config.grpo_key_dump), its rollout batches
# and lengths; evaluation's generation batches; a probe's problems and samples.
_OOM_ADVICE = {
    "train": "lower grpo.memory.micro_batch_size or grpo.memory.max_tokens_per_micro_batch, or set "
             "grpo.memory.gradient_checkpointing=true (training then resumes from its last checkpoint), else lower "
             "grpo.rollout_batch_size or shorten sampling.max_new_tokens (training starts over)",
    "evaluate": "lower sampling.batch_size or shorten sampling.max_new_tokens",
    "probe": "lower the analysis's max_batch_tokens, n_samples or max_new_tokens option, or set max_problems",
}
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
_NOT_TRANSIENT_OS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


def is_transient(exc: BaseException) -> bool:
    """True for failures a retry can fix; see the module docstring for the lists."""
    if isinstance(exc, ChildError):  # the child's own verdict, or ours from its death
        return exc.transient
    if isinstance(exc, TransientError):
        return True
    if isinstance(exc, (DeterministicError, ConfigError, GuardError)) or is_oom(exc):
        return False  # is_oom before RuntimeError: CUDA OOM is a RuntimeError subclass
    if isinstance(exc, (ConnectionError, TimeoutError)):  # ConnectionResetError, BrokenPipeError, socket.timeout
        return True
    if _is_botocore_transient(exc) or _is_http_transient(exc):
        return True
    if isinstance(exc, OSError) and not isinstance(exc, _NOT_TRANSIENT_OS):
        return exc.errno in _TRANSIENT_ERRNO
    if is_dist_error(exc, network_only=True):  # collective timeouts (NCCL/gloo)
        return True
    return type(exc) is RuntimeError and any(t in str(exc).lower() for t in _TRANSIENT_TEXT)


def is_dist_error(exc: BaseException, *, network_only: bool = False) -> bool:
    """A torch.distributed error (`network_only`: its backend, network and store errors)."""
    dist = sys.modules.get("torch.distributed")
    names = ("DistBackendError", "DistNetworkError", "DistStoreError") if network_only else ("DistError",)
    classes = tuple(c for c in (getattr(dist, n, None) for n in names) if isinstance(c, type))
    return bool(classes) and isinstance(exc, classes)


def is_oom(exc: BaseException) -> bool:
    """An allocation failure: MemoryError, torch's (CUDA) OutOfMemoryError, or an allocator's message."""
    torch = sys.modules.get("torch")
    torch_oom = getattr(torch, "OutOfMemoryError", None)
    if isinstance(exc, MemoryError) or (isinstance(torch_oom, type) and isinstance(exc, torch_oom)):
        return True
    return any(t in str(exc).lower() for t in _OOM_TEXT)


def oom_guard(stage: str) -> str:
    """The line an out-of-memory failure ends with: what to change, since a retry would run out again."""
    return (f"{GUARD_PREFIX} the {stage} stage ran out of memory and is not retried (the same batch would run out "
            "again): " + _OOM_ADVICE.get(stage, _OOM_ADVICE["train"]))


def needs_oom_guard(exc: BaseException) -> bool:
    """Out of memory and not yet carrying the G-oom line (a child's or a launched group's failure already does)."""
    says_it = isinstance(exc, OutOfMemory) or (isinstance(exc, ChildError) and exc.kind == "oom")
    return is_oom(exc) and not says_it


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
