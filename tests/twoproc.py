"""Launch a test script on 2 CPU processes with torchrun, as a user would, for the parity tests.

Shared by the trainer's and the export's 2-rank tests. The script (a test module's own `__main__`) gets
the path of a JSON spec; each rank writes its results next to it for the test to compare.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from rlvr_core.core.net import free_port

# Variables a launcher sets; inherited from an outer launch they would confuse the inner one.
LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "MASTER_ADDR",
               "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def run_two_ranks(script: str | Path, spec_path: str | Path, timeout: int = 600) -> tuple[subprocess.CompletedProcess, float]:
    """`torch.distributed.run --nproc_per_node 2 script spec_path`, one thread per rank (2 cores here).
    Returns the finished process (the caller asserts on it) and the launch's wall seconds."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), str(script), str(spec_path)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    return proc, time.perf_counter() - t0
