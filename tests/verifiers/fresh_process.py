"""Time verifications in a fresh Python process, the way a `VerifierPool` worker runs them.

A CPU-time bound measured inside a pytest worker measures that worker too: by the time a verifier test runs it
may hold hundreds of earlier tests' objects (models, SQLAlchemy sessions, Prefect clients) and threads, and a
full garbage collection of that heap, with its finalizers and weakref callbacks, can land inside one
verification and add a second of CPU time (seen in CI: a "1+1+…+1" answer used 1.50 s of `process_time()`
against its 0.5 s limit, idle it uses 0.505 s). The verifier's own behaviour is what its workers see: a
process that only verifies. `FreshProcess` is one such process, started once per test module and reused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from rlvr_core.verifiers import Outcome, Status

ROOT = Path(__file__).resolve().parents[2]

# Reads one JSON request per line, answers one JSON line: the outcome, and the CPU and wall seconds of the
# verification alone (process_time: the process's CPU time, what the verifiers' own limit counts).
_SERVER = r"""
import json, sys, time
from rlvr_core.verifiers import get_verifier
replies, sys.stdout = sys.stdout, sys.stderr  # whatever a verifier prints cannot corrupt the replies
built = {}
for line in sys.stdin:
    req = json.loads(line)
    key = json.dumps([req["name"], req["options"]], sort_keys=True)
    if key not in built:
        built[key] = get_verifier(req["name"], **req["options"])
        built[key].warm_up()
    v = built[key]
    t, c = time.monotonic(), time.process_time()
    out = v.verify(req["response"], req["gold"])
    cpu, wall = time.process_time() - c, time.monotonic() - t
    print(json.dumps({"outcome": out.to_dict(), "cpu_s": cpu, "wall_s": wall}), file=replies, flush=True)
"""


class FreshProcess:
    """One Python process that only verifies; `timed` sends it one verification at a time."""

    def __init__(self) -> None:
        paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
        self._proc = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)

    def timed(self, name: str, response: str, gold: Any, **options: Any) -> tuple[Outcome, float, float]:
        """(outcome, CPU seconds, wall seconds) of verifying `response` against `gold` with verifier `name`."""
        request = {"name": name, "options": options, "response": response, "gold": gold}
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the verifying process exited with {self._proc.wait()} (its stderr is above)")
        got = json.loads(line)
        d = got["outcome"]
        outcome = Outcome(**{**d, "status": Status(d["status"])})
        return outcome, got["cpu_s"], got["wall_s"]

    def close(self) -> None:
        self._proc.stdin.close()
        self._proc.wait(timeout=30)
