"""Progress lines for long work, on stderr so stdout stays machine-readable (`--json`)."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, enabled: bool = True, stream=None):
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.t0 = time.monotonic()
        self._last: dict[str, float] = {}

    def __call__(self, stage: str, message: str, *, every_s: float = 0.0) -> None:
        """Print `[  12.3s] stage: message`; with every_s, at most one line per stage per every_s."""
        if not self.enabled:
            return
        now = time.monotonic()
        if every_s and now - self._last.get(stage, -1e9) < every_s:
            return
        self._last[stage] = now
        print(f"[{now - self.t0:7.1f}s] {stage}: {message}", file=self.stream, flush=True)

    def counter(self, stage: str, what: str, every_s: float = 5.0):
        """A callback (done, total[, value]) → throttled progress line."""

        def report(done: int, total: int, value: float | None = None) -> None:
            extra = f" ({value:.4g})" if value is not None else ""
            self(stage, f"{what} {done}/{total}{extra}", every_s=0.0 if done >= total else every_s)

        return report


SILENT = Progress(enabled=False)
