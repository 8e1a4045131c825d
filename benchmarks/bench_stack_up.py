"""How long `rlvr stack up` takes, and where the time goes: the whole local stack (S3, MLflow, PostgreSQL,
Prefect with its deployments and workers) on a fresh home, then `down` + `up` again on the same home.

    python benchmarks/bench_stack_up.py [--rounds 3] [--home DIR]

All ports are `0` (any free port), so it runs beside a stack on the default ports. Round 1 is the first start
(initdb, database migrations, deployments); the later rounds are restarts. Prints one JSON line per round:
`up_s`, `down_s` and each phase as [name, started at (s after up began), took (s)], timed by wrapping the start
and wait functions of `rlvr_core.pipeline.stack` and `flows.local_stack`. The home is removed afterwards
unless `--home` was given.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PHASES = {"rlvr_core.pipeline.stack": ("_start_s3", "_s3_ready", "_start_mlflow", "_start_postgres", "_wait_healthy"),
          "flows.local_stack": ("prefect_up", "_wait_healthy", "_run", "start_worker")}


def _wrap(module, name: str, marks: list, t0: list) -> None:
    """Replace module.name by a timed copy that appends [label, start, took] to `marks`."""
    f = getattr(module, name)

    @functools.wraps(f)
    def timed(*a, **k):
        start = time.monotonic()
        try:
            return f(*a, **k)
        finally:
            label = f"{module.__name__.rsplit('.', 1)[-1]}.{name}" + (f" ({a[2]})" if name == "_run" else "")
            marks.append([label, round(start - t0[0], 1), round(time.monotonic() - start, 1)])
    setattr(module, name, timed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--home", type=Path, default=None, help="a fresh folder for the stack (default: a temporary one)")
    a = ap.parse_args()
    import importlib

    from rlvr_core.pipeline import stack
    from flows import local_stack

    marks: list = []
    t0 = [0.0]
    for mod, names in PHASES.items():
        for n in names:
            if hasattr(importlib.import_module(mod), n):
                _wrap(importlib.import_module(mod), n, marks, t0)
    home = a.home or Path(tempfile.mkdtemp(prefix="bench-stack-up-"))
    try:
        for i in range(a.rounds):
            marks.clear()
            t0[0] = time.monotonic()
            state = stack.up(home=home, mlflow_port=0, s3_port=0, prefect_port=0, pg_port=0, prefect_hooks=local_stack)
            up_s = time.monotonic() - t0[0]
            t = time.monotonic()
            stack.down(home=home, prefect_hooks=local_stack)
            print(json.dumps({"round": i + 1, "kind": "first start" if i == 0 else "restart", "up_s": round(up_s, 1),
                              "down_s": round(time.monotonic() - t, 1),
                              "deployments": state["prefect"].get("deployments"), "phases": marks}), flush=True)
    finally:
        stack.down(home=home, prefect_hooks=local_stack)
        if a.home is None:
            stack.down(home=home, delete_data=True, prefect_hooks=local_stack)
            shutil.rmtree(home, ignore_errors=True)
    print("load average:", Path("/proc/loadavg").read_text().split()[:3])


if __name__ == "__main__":
    main()
