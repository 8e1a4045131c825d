"""A verifier's own time limit on one item, counted in CPU time, from inside the process.

Why CPU time: a wall-clock alarm (math-verify's `signal.alarm`, fixed at whole seconds) measures the
machine as much as the item: on a loaded machine an answer that needs 0.4 s of CPU can take seconds of
wall time and come back as `timeout`, a lost reward. `ITIMER_PROF` counts the CPU time the process
actually gets, so load slows an item down without failing it.

Why it is only a first line: a signal handler runs between Python bytecodes, so it cannot stop a long
C-level operation (a huge integer power inside sympy). `VerifierPool` kills such a worker from outside
shortly after the same limit. Signals can only be armed on the main thread; elsewhere (Prefect task
threads) the limit is off and the pool is the only limit.
"""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager
from typing import Iterator


# CPU seconds between repeats of the limit's signal once the limit is reached (see `cpu_time_limit`).
REPEAT_S = 0.05


class VerifierTimeout(BaseException):
    """The item used up its CPU-time limit inside the verifier. A BaseException, like KeyboardInterrupt,
    so that the `except Exception` blocks inside math-verify, sympy and latex2sympy do not swallow it."""


def _available() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


@contextmanager
def cpu_time_limit(seconds: float | None) -> Iterator[None]:
    """Raise `VerifierTimeout` in the block once the process has used `seconds` of CPU time in it.

    No-op for None/0 or off the main thread. Restores the previous SIGPROF handler and timer, so it nests
    under a caller's own profiler timer only by replacing it for the block's duration.
    """
    if not seconds or seconds <= 0 or not _available():
        yield
        return

    active = [True]
    in_hook = [False]  # an unraisable-exception hook is running: let it finish, the repeat comes later

    def handler(signum, frame):  # noqa: ARG001
        if not active[0]:  # fired between the block's end and the disarm below
            signal.setitimer(signal.ITIMER_PROF, 0)
            return
        if in_hook[0]:
            return
        raise VerifierTimeout(f"used {seconds:g} s of CPU time")

    old_hook = sys.unraisablehook

    def unraisable_hook(unraisable):
        # The limit fired inside a finalizer or weakref callback: Python drops that exception and hands it
        # to this hook. It is our own signal, not an error, and the repeat raises it again in the block.
        # Anything else goes to the previous hook, which must not be interrupted half-way (pytest's, for
        # one, then reports "Failed to process unraisable exception" and fails the test).
        if isinstance(unraisable.exc_value, VerifierTimeout):
            return
        in_hook[0] = True
        try:
            old_hook(unraisable)
        finally:
            in_hook[0] = False

    old_handler = signal.signal(signal.SIGPROF, handler)
    sys.unraisablehook = unraisable_hook
    # The timer repeats every REPEAT_S after the limit: an exception raised while Python runs a
    # finalizer or a weakref callback (a garbage collection inside sympy, say) is dropped, and the
    # item would otherwise run on without a limit.
    old_timer = signal.setitimer(signal.ITIMER_PROF, seconds, REPEAT_S)
    try:
        yield
    finally:
        active[0] = False
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, old_handler)
        if sys.unraisablehook is unraisable_hook:
            sys.unraisablehook = old_hook
        if old_timer[0] > 0:
            signal.setitimer(signal.ITIMER_PROF, *old_timer)
