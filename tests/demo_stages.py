"""The demo's data and warm-started base model, built once per test session and copied into the RLVR_HOMEs of
the tests that run the demo recipe in subprocesses (`rlvr demo`, `rlvr sweep run demo-lr`), so their first
run finds both stages cached instead of each test worker training the same 300-step warm start.

The build runs in a subprocess with the thread settings the tests' runs have (OMP_NUM_THREADS, 1 unless set:
what the xdist workers and the local stack's Prefect workers use), because the thread count is part of the base
model's cache key: a build at other numerics would be a folder no run looks up. Under xdist the workers share
one folder (the session's base temp) and an exclusive file lock: the first builds, the others wait and reuse.
A wait is bounded: past LOCK_WAIT_S the waiter builds its own copy. docs/testing.md: what is shared and why.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
LOCK_WAIT_S = 900  # the warm start takes ~1.5 min beside another worker; a holder stuck longer is not waited for
RESULT = "stages.json"

BUILD = """
import json
from rlvr_core.experiment.config import demo_config
from rlvr_core.pipeline.stages import prepare_base_model, prepare_data
cfg = demo_config()
data = prepare_data(cfg)
model = prepare_base_model(cfg, data)
print(json.dumps({"data": str(__import__("pathlib").Path(data.train_path).parent), "base_model": model.path}))
"""


def build_env(home: Path) -> dict[str, str]:
    """The environment the tests' `rlvr` runs have (no MLFLOW_/PREFECT_/RLVR_ settings), with RLVR_HOME=home
    and their thread settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PREFECT_", "RLVR_"))}
    threads = os.environ.get("OMP_NUM_THREADS", "1")
    env.update(RLVR_HOME=str(home), OMP_NUM_THREADS=threads, MKL_NUM_THREADS=os.environ.get("MKL_NUM_THREADS", threads))
    return env


def build(folder: Path) -> dict[str, str]:
    """Build the data and base-model stages under `folder/home`; {stage: its cache folder}, also kept in
    folder/stages.json (written last, so its presence means the build finished)."""
    proc = subprocess.run([sys.executable, "-c", BUILD], env=build_env(folder / "home"), cwd=str(ROOT),
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"building the demo's stages failed:\n{proc.stderr[-4000:]}")
    stages = json.loads(proc.stdout.strip().splitlines()[-1])
    tmp = folder / f".{RESULT}.{os.getpid()}"
    tmp.write_text(json.dumps(stages))
    os.replace(tmp, folder / RESULT)
    return stages


def shared_build(folder: Path, fallback: Callable[[], Path], wait_s: float = LOCK_WAIT_S) -> dict[str, str]:
    """The stages built in `folder` by whichever process takes its lock first; built in a folder of this
    process's own (`fallback()`) instead if the lock is not free within `wait_s` (its holder hangs)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "lock", "w") as lock:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return build(fallback())
                time.sleep(1)
        try:
            if (folder / RESULT).is_file():
                return json.loads((folder / RESULT).read_text())
            return build(folder)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def seed_home(home: Path, stages: dict[str, str]) -> list[Path]:
    """Copy each finished stage folder into `home`'s cache (`cache/<stage>/<key>/`, with its cache_key.json and
    done marker), unless already there; the copies appear whole (copied aside, then renamed)."""
    out = []
    for stage, src in stages.items():
        dst = home / "cache" / stage / Path(src).name
        if not (dst / ".done").exists():
            tmp = dst.parent / f".seed-{dst.name}-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(src, tmp)
            shutil.rmtree(dst, ignore_errors=True)
            os.replace(tmp, dst)
        out.append(dst)
    return out


class DemoStages:
    """The session's shared build, made (or waited for) on first use, so a test can start its servers first."""

    def __init__(self, folder: Path, fallback: Callable[[], Path]):
        self.folder, self.fallback, self.stages = folder, fallback, None

    def seed(self, home: Path) -> list[Path]:
        if self.stages is None:
            self.stages = shared_build(self.folder, self.fallback)
        return seed_home(home, self.stages)
