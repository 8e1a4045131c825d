"""Start a child and judge how it ended: `run_child` for one child whose output is streamed to a log (a stage, a
probe), `start_child` for the nodes of a launched group (`rlvr_core.pipeline.launch` waits for them as a group),
`child_env` for the environment of both, `death_error` for the verdict on a child that died without a report."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Mapping

from rlvr_core.pipeline.child.death import classify_death, oom_kill_count
from rlvr_core.pipeline.child.errors import StageProcessError
from rlvr_core.pipeline.child.protocol import read_report
from rlvr_core.pipeline.child.transient import oom_guard

ROOT = Path(__file__).resolve().parents[3]  # the repository: a child imports this checkout's modules
# What a child's environment holds where neither the parent's environment nor the caller sets it.
ENV_DEFAULTS = {
    "OMP_NUM_THREADS": "1",  # one OpenMP thread; a stage child sets torch's own count (RLVR_STAGE_THREADS)
}
TAIL_LINES = 20  # the last output lines a death's error quotes


def child_env(secrets: Mapping[str, str] | None = None, *, drop: Iterable[str] = (),
              overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment less `drop`, with the sealed request's `secrets`, the repository first on
    PYTHONPATH, `ENV_DEFAULTS` where unset, and `overrides` over all."""
    dropped = frozenset(drop)
    env = {k: v for k, v in os.environ.items() if k not in dropped} | dict(secrets or {})
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return {**ENV_DEFAULTS, **env, **(overrides or {})}


def start_child(cmd: list[str], env: Mapping[str, str], *, stdout: IO | int | None = None, cwd: Path | None = ROOT,
                own_session: bool = False) -> subprocess.Popen:
    """Start `cmd` in `cwd` (None: this process's). `own_session`: a process group of its own (a node, killed as
    a whole); otherwise the caller's, so whoever kills the flow run's process group kills the child with it."""
    return subprocess.Popen(cmd, cwd=cwd, env=dict(env), stdout=stdout,
                            stderr=subprocess.STDOUT if stdout is not None else None,
                            start_new_session=own_session, text=stdout == subprocess.PIPE,
                            bufsize=1 if stdout == subprocess.PIPE else -1)


def kill_child(p: subprocess.Popen, *, group: bool = False) -> None:
    """SIGKILL the child (`group`: its whole process group) and reap it."""
    try:
        if group:
            os.killpg(p.pid, signal.SIGKILL)
        else:
            p.kill()
    except (ProcessLookupError, PermissionError):
        pass
    p.wait()


@dataclass(frozen=True)
class Outcome:
    """How a child ended: its exit status (None: never reaped), the last lines it printed, the OOM-kill count
    before it started, and whether it was stopped at its time limit."""

    pid: int
    returncode: int | None
    tail: list[str]
    oom_kills_before: int | None
    timed_out: bool = False


def run_child(name: str, cmd: list[str], env: Mapping[str, str], *, timeout_s: float | None = None,
              log: Callable[[str], None] | None = None) -> Outcome:
    """Run `cmd`, each output line to `log` as "NAME: line" as it comes (progress bars left out), until it ends
    or `timeout_s` passes (then it is killed). The wait does not depend on the output: a child that hangs with
    its output open is stopped all the same."""
    log = log or _stderr
    oom_kills = oom_kill_count()  # compared after a death without a report: was it the OOM killer?
    proc = start_child(cmd, env, stdout=subprocess.PIPE)
    log(f"{name}: child process {proc.pid}")
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    reader = threading.Thread(target=_stream, args=(proc.stdout, name, log, tail), daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_child(proc)
    except BaseException:
        kill_child(proc)
        raise
    reader.join(timeout=5)  # what is left in the pipe; a grandchild holding it open is not waited for
    return Outcome(proc.pid, proc.returncode, list(tail), oom_kills, timed_out)


def _stream(out: IO[str], name: str, log: Callable[[str], None], tail: deque[str]) -> None:
    """Read the child's output to its end. A log that fails loses that line only: the pipe must keep draining,
    or a child writing to a full pipe would block."""
    for line in out:
        line = line.rstrip()
        if line and "it/s]" not in line:  # progress bars are noise in the run log
            tail.append(line)
            try:
                log(f"{name}: {line}")
            except Exception:  # noqa: BLE001 - see above
                pass


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def stage_verdict(stage: str, outcome: Outcome, result: Path, timeout_s: float | None = None) -> Any:
    """A stage child's result, or the StageProcessError that says why there is none: its own failure report,
    its time limit, or its death."""
    if outcome.timed_out:
        raise StageProcessError(f"{stage} process {outcome.pid} ran past its time limit of {timeout_s} s and was "
                                f"killed (a hang repeats: not retried){_lines(outcome.tail)}", transient=False,
                                returncode=outcome.returncode, kind="timeout")
    report = read_report(result)
    if report is None:  # the process died before it could report (the OOM killer, another signal, a hard crash)
        raise death_error(f"{stage} process {outcome.pid} exited with status {outcome.returncode} without a result",
                          outcome, stage)
    value, failure = report
    if failure is None:
        return value
    raise StageProcessError(f"{stage} failed in its process: {failure.error_type}: {failure.message}\n"
                            f"{failure.traceback}", transient=failure.transient, returncode=outcome.returncode,
                            error_type=failure.error_type, kind=failure.kind)


def death_error(head: str, outcome: Outcome, stage: str, *, retry: str = "a retry resumes") -> StageProcessError:
    """The error for a child that died without reporting, judged by `death.classify_death`: a SIGKILL while the
    cgroup's OOM-kill count went up is the kernel's OOM killer, deterministic and ending with the G-oom line
    (`stage`'s advice); any other kill is pre-emption, transient (`retry` says what a retry does); a crash is
    deterministic."""
    code, output = outcome.returncode, _lines(outcome.tail)
    death = classify_death(code, outcome.oom_kills_before)
    if death.kind == "oom":
        return StageProcessError(f"{head}: {death.says}{output}\n{oom_guard(stage)}", transient=False,
                                 returncode=code, error_type="OOMKilled", kind="oom")
    if death.transient:
        return StageProcessError(f"{head} (killed by a signal, no OOM kill recorded: transient, {retry}){output}",
                                 transient=True, returncode=code, kind="killed")
    return StageProcessError(head + output, transient=False, returncode=code, kind="crashed")


def _lines(tail: list[str]) -> str:
    return "".join(f"\n{line}" for line in tail)
