"""Run a heavy stage (`train`, `evaluate`) in a child process (`rlvr_core.pipeline.child.stage`) from a Prefect task.

GPU memory, DeepSpeed's process-group state and leaked threads go away with the process, and a kill
(pre-emption, a lost node) reaches the task as a `StageProcessError` marked transient, which the retry rule
(`tasks.retry.retry_condition_fn`) re-runs; a retried training stage resumes from its last checkpoint. A
SIGKILL from the kernel's OOM killer (the memory cgroup's OOM-kill count went up while the child ran) is
not retried: it fails at once with the G-oom line. The protocol (sealed request, parent watch, report, death
verdict) and `run_child` are `rlvr_core.pipeline.child`'s; this module adds only the Prefect run log and the
private folder the request travels in.
The pipeline flow runs stages this way unless it is told to run them in-process (`rlvr demo` on a laptop).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from prefect import get_run_logger

from rlvr_core.core import settings
from rlvr_core.pipeline.child.protocol import write_request
from rlvr_core.pipeline.child.run import child_env, run_child, stage_verdict


def run_stage_process(stage: str, request: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
    """Run the `stage` child; return its result or raise StageProcessError (`timeout_s`: kill it after that long,
    not retried).

    The request file never holds a secret: its secrets are sealed (`rlvr_core.experiment.secrets`) and travel in
    the child's environment. The file is private (0600, in a 0700 folder), the child deletes it once read, and
    the folder goes when the stage ends, whether it succeeded, failed or was killed."""
    work = Path(tempfile.mkdtemp(prefix=f"rlvr-{stage}-", dir=tmp_root()))  # mode 0700
    try:
        req, res = work / "request.json", work / "result.json"
        env = child_env(write_request(req, request))
        cmd = [sys.executable, "-m", "rlvr_core.pipeline.child.stage", stage, str(req), str(res)]
        outcome = run_child(stage, cmd, env, timeout_s=timeout_s, log=run_log())
        return stage_verdict(stage, outcome, res, timeout_s)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_log():
    """The Prefect run logger's `info`, or None outside a run (tests, benchmarks: plain stderr)."""
    try:
        return get_run_logger().info
    except Exception:  # noqa: BLE001 - no run context
        return None


def tmp_root() -> str:
    d = settings.paths().home / "tmp"
    d.mkdir(parents=True, exist_ok=True)
    return str(d)
