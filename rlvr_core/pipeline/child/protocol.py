"""What a parent and its child agree on: the sealed request, the parent watch, the report (a result, or a typed
`ChildFailure`, written atomically) and `serve`, the skeleton the stage and rank entry points run.

* Sealed request (`write_request`, `read_request`): the request file holds no secret; its secrets are sealed
  (`rlvr_core.experiment.secrets`) and travel in the child's environment. The file is private (0600).
* Parent watch (`watch_parent`): a child exits (status 137) when whoever started it is gone, so no orphan keeps
  writing checkpoints into the folder a retry is about to resume from.
* Report: `{"ok": true, "result": ...}`, or `{"ok": false, "failure": ChildFailure}` with the child's own
  verdict (`transient.is_transient`); out of memory is kind "oom" and ends with the G-oom line. A child that
  writes no report died, and its parent judges the death (`death.classify_death`).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from rlvr_core.experiment.secrets import seal, unseal
from rlvr_core.pipeline.child.transient import is_oom, is_transient, needs_oom_guard, oom_guard


# ---------------------------------------------------------------------------- sealed request
def write_request(path: Path, request: dict[str, Any]) -> dict[str, str]:
    """Write the sealed request, readable by its owner only; return the secrets it left out, by variable name
    (the child's environment carries them)."""
    sealed, secrets = seal(request)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        f.write(json.dumps(sealed, default=str))
    return secrets


def read_request(path: Path, *, delete: bool) -> dict[str, Any]:
    """The request with its secrets filled in from this process's environment. `delete`: remove the file once
    read (a stage child, its only reader), so none is left behind even if this process is killed."""
    text = path.read_text()
    if delete:
        path.unlink(missing_ok=True)
    return unseal(json.loads(text), str(path))


# ---------------------------------------------------------------------------- parent watch
def watch_parent(launcher_pid: int | None = None, interval_s: float = 0.2) -> None:
    """Exit with status 137 when this process's parent changes (it died: we were re-parented), or when
    `launcher_pid` is gone. A rank passes the stage process that launched its group: torchrun starts each rank
    in a session of its own, so killing the agent's process group would leave the rank training on."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(137)
            if launcher_pid is not None:
                try:
                    os.kill(launcher_pid, 0)
                except ProcessLookupError:
                    os._exit(137)
            time.sleep(interval_s)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


# ---------------------------------------------------------------------------- report
RANK_RESULT = "result.json"  # a launched group's result, written by rank 0 next to the request


def rank_error_file(work: Path, rank: int) -> Path:
    """Where rank `rank` of a launched group reports its failure."""
    return work / f"rank{rank}.error.json"


@dataclass(frozen=True)
class ChildFailure:
    """A child's account of its own failure. `kind`: "error", "oom" (the traceback ends with the G-oom line) or
    "peer_lost" (a rank whose error only says its peers went away); `transient`: its verdict (`is_transient`);
    `error_type`: the exception's class, module-qualified."""

    kind: str
    transient: bool
    message: str
    traceback: str
    error_type: str

    @classmethod
    def of(cls, exc: BaseException, stage: str) -> "ChildFailure":
        """The failure `exc` of a child running `stage` ("train", "evaluate": the G-oom line's advice)."""
        tb = "".join(traceback.format_exception(exc)) + (oom_guard(stage) if needs_oom_guard(exc) else "")
        return cls("oom" if is_oom(exc) else "error", is_transient(exc), str(exc), tb,
                   f"{type(exc).__module__}.{type(exc).__name__}")


def write_json(path: Path, value: Any) -> None:
    """Write `value` as JSON all at once: a reader sees the whole file or none."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, default=str))
    os.replace(tmp, path)


def read_report(path: Path) -> tuple[Any, ChildFailure | None] | None:
    """(result, None) or (None, failure) from a report; None when the child wrote none."""
    if not path.is_file():
        return None
    out = json.loads(path.read_text())
    return (out["result"], None) if out["ok"] else (None, ChildFailure(**out["failure"]))


def serve(request: Path, run: Callable[[dict[str, Any]], Any], *, result: Path, failure: Path, delete: bool,
          judge: Callable[[BaseException], ChildFailure], echo: bool = False) -> int:
    """The skeleton of the stage and rank entry points: read the sealed request inside the `try` (a missing secret is this
    child's own failure, reported like any other), run, write the result (when `run` returns one) or the failure
    as `judge` sees it. `echo`: print the traceback to stderr too (a node's log). Returns the exit status."""
    try:
        out = run(read_request(request, delete=delete))
        if out is not None:
            write_json(result, {"ok": True, "result": out})
        return 0
    except BaseException as e:  # noqa: BLE001 - every failure is reported to the parent, classified
        report = judge(e)
        write_json(failure, {"ok": False, "failure": asdict(report)})
        if echo:
            print(report.traceback, file=sys.stderr, flush=True)
        return 1
    finally:
        sys.stdout.flush()
