"""Run a heavy stage (`train`, `evaluate`) in a child process: `python -m tasks.stage_runner STAGE REQUEST RESULT`.

GPU memory, DeepSpeed's process-group state and leaked threads go away with the process, and a kill
(pre-emption, a lost node) reaches the task as a `StageProcessError` marked transient, which the retry rule
(`tasks.retry.retry_condition_fn`) re-runs; a retried training stage resumes from its last checkpoint. A
SIGKILL from the kernel's OOM killer (the memory cgroup's OOM-kill count went up while the child ran) is
not retried: it fails at once with the G-oom line (`tasks.retry.stage_death`). The sealed request, the parent
watch and the death classification are the protocol every pipeline child follows
(`rlvr_core.pipeline.child`); this module adds only the Prefect run log.
The pipeline flow runs stages this way unless it is told to run them in-process (`rlvr demo` on a laptop).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from prefect import get_run_logger

from rlvr_core.core import settings
from rlvr_core.pipeline.child import write_request
from tasks.retry import StageProcessError, oom_kill_count, stage_death

ROOT = Path(__file__).resolve().parent.parent


def run_stage_process(stage: str, request: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
    """Run `tasks.stage_runner STAGE` in a child process; return its result or raise StageProcessError.

    The request file never holds a secret: its secrets are sealed (`rlvr_core.experiment.secrets`) and travel in
    the child's environment. The file is private (0600, in a 0700 folder), the child deletes it once read, and
    the folder goes when the stage ends, whether it succeeded, failed or was killed."""
    work = Path(tempfile.mkdtemp(prefix=f"rlvr-{stage}-", dir=tmp_root()))  # mode 0700
    try:
        secrets = write_request(work / "request.json", request)
        return _run_child(stage, work, secrets, timeout_s)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run_child(stage: str, work: Path, secrets: dict[str, str], timeout_s: float | None) -> dict[str, Any]:
    try:
        logger = get_run_logger()
        log = logger.info
    except Exception:  # noqa: BLE001 - called outside a run (tests, benchmarks): plain stderr
        def log(msg: str) -> None:
            print(msg, file=sys.stderr, flush=True)
    req, res = work / "request.json", work / "result.json"
    env = {**os.environ, **secrets}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [sys.executable, "-m", "tasks.stage_runner", stage, str(req), str(res)]
    oom_kills = oom_kill_count()  # compared after a death without a result: was it the OOM killer?
    # Same process group as the task: whoever kills the flow run's process group kills the stage with it.
    proc = subprocess.Popen(cmd, cwd=str(ROOT), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1)
    log(f"{stage}: child process {proc.pid}")
    tail: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip()
            if line and "it/s]" not in line:  # progress bars are noise in the run log
                log(f"{stage}: {line}")
                tail = (tail + [line])[-20:]
        code = proc.wait(timeout=timeout_s)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    if res.is_file():
        out = json.loads(res.read_text())
        if out["ok"]:
            return out["result"]
        raise StageProcessError(f"{stage} failed in its process: {out['error_type']}: {out['message']}\n"
                                f"{out['traceback']}", transient=out["transient"], returncode=code,
                                error_type=out["error_type"])
    # No result file: the process died before it could report (the OOM killer, another signal, a hard crash).
    raise stage_death(stage, proc.pid, code, oom_kills, tail)


def tmp_root() -> str:
    d = settings.paths().home / "tmp"
    d.mkdir(parents=True, exist_ok=True)
    return str(d)
