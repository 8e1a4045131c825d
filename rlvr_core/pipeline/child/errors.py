"""The exceptions that carry a verdict of their own: our code's "transient" and "deterministic", an out-of-memory
failure that already says what to lower, and `ChildError`, a child process that failed (with the child's own
kind and verdict, or the parent's from its death)."""

from __future__ import annotations


class TransientError(RuntimeError):
    """Raised by our own code for a failure known to be transient (a crashed trial flow run: `FlowRunCrashed`). A
    killed stage child is a `ChildError` with its own verdict."""


class DeterministicError(RuntimeError):
    """Raised by our own code for a failure known to repeat (a trial flow run that failed after its stages' own
    retries; out of memory in an in-process stage: `OutOfMemory`)."""


class OutOfMemory(DeterministicError):
    """Out of memory, its message already ending with the G-oom line (`transient.oom_guard`)."""


class ChildError(RuntimeError):
    """A child process ended badly. `transient`: the child's own verdict, or the parent's from its exit status;
    `kind`: "error" (raised in the child), "oom" (out of memory: the message ends with the G-oom line), "killed",
    "crashed" (died without a signal or a report), "timeout", "peer_lost" (a rank that only lost its peers);
    `error_type`: the child's exception, module-qualified, or "OOMKilled" for the kernel's OOM killer."""

    def __init__(self, message: str, *, transient: bool, returncode: int | None = None,
                 error_type: str | None = None, kind: str = "error"):
        super().__init__(message)
        self.transient = transient
        self.returncode = returncode
        self.error_type = error_type
        self.kind = kind

    def __reduce__(self):  # keeps the verdict through pickling (Prefect's results, a flow run's state)
        return _rebuild, (type(self), str(self), {"transient": self.transient, "returncode": self.returncode,
                                                  "error_type": self.error_type, "kind": self.kind})


def _rebuild(cls: type, message: str, fields: dict) -> ChildError:
    return cls(message, **fields)


class StageProcessError(ChildError):
    """A stage child (`child.stage`) or a probe child (`rlvr probe`) ended badly."""
