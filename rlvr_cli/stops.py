"""What `rlvr demo` (and `rlvr run`) print when a guard stops the run: one line naming the guard, the step and
the setting to change, then why and where the details are, and exit code 3. The full traceback goes to the
run's log file (`$RLVR_HOME/logs/`), and to the terminal only with `--verbose`.

A leaf module like common.py: the command modules import it; it imports none of them, and nothing heavy.
"""

from __future__ import annotations

import logging
import time
import traceback
from pathlib import Path
from typing import Any

import typer

from rlvr_core.experiment.guards import GuardError, RunStopped

STOP_EXIT_CODE = 3  # a guard stopped the run (2: a bad config or command line; 1: anything else)


def _advice(guard: str, message: str, grpo: Any) -> str:
    """The setting a user changes first after this guard stopped a run, with its current value."""
    lr, beta = f"grpo.lr (now {grpo.lr:g})", f"grpo.beta (now {grpo.beta:g})"
    if "non-finite" in message:
        return f"lower {lr}; with bf16/fp16 also check grpo.adam_eps (now {grpo.adam_eps:g})"
    advice = {
        "G-collapse": f"lower {lr}; the thresholds are grpo.guards.health.collapse",
        "G-kl-explosion": f"lower {lr} or raise {beta}; the thresholds are grpo.guards.health.kl_explosion",
        "G-entropy": f"lower {lr} or raise {beta}; the thresholds are grpo.guards.health.entropy",
        # G-no-signal's message names its cause and the setting to change: that part is the advice.
        "G-no-signal": message.split("cause: ", 1)[-1].splitlines()[0] if "cause: " in message else
        "check reward.verifier / reward.mode and the temperatures (sampling, grpo)",
        "G-logprob-temp": f"set grpo.logprob_temperature to 1 (now {grpo.logprob_temperature:g}): the rollout "
                          "engine's log-probs are at temperature 1",
    }
    return advice.get(guard, f"see docs/guards.md, {guard}")


def guard_stop(err: BaseException) -> tuple[str, int | None] | None:
    """(guard id, step) when `err` is a guard's stop (GuardError, or the pipeline's RunStopped with the record of
    the stopped run); None for any other failure."""
    if isinstance(err, (GuardError, RunStopped)):
        return err.guard or "a guard", err.step
    return None


def stop_lines(err: BaseException, cfg: Any, command: str, log_path: Path | None) -> list[str] | None:
    """The lines printed for a guard's stop (see the module docstring); None when `err` is not one."""
    hit = guard_stop(err)
    if hit is None:
        return None
    guard, step = hit
    stopped = err.record if isinstance(err, RunStopped) else {}
    at = f" at step {step} of {cfg.grpo.steps}" if step else (" before training" if step == 0 else "")
    why = stopped.get("reasons") or str(err).splitlines()[0]
    mlflow = stopped.get("mlflow_open") or stopped.get("mlflow_run_url")
    details = [f"report {stopped['report']}" if stopped.get("report") else None,
               f"MLflow {mlflow}" if mlflow else None,
               f"training summary {stopped.get('train_summary') or stopped['train_folder'] + '/grpo_summary.json'}"
               if stopped.get("train_summary") or stopped.get("train_folder") else None,
               f"log {log_path}" if log_path else None]
    return [f"rlvr {command}: stopped by {guard}{at}; {_advice(guard, str(err), cfg.grpo)}",
            f"  why: {why}",
            "  details: " + "; ".join(d for d in details if d) + " (full traceback: --verbose or the log)"]


class _NoTracebacks(logging.Filter):
    """Keeps Prefect's failure records (the task's and flow's tracebacks) off the terminal; they stay in the log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name.startswith("prefect.") and (record.exc_info or record.levelno >= logging.ERROR))


def route_logs(home: Path, command: str, verbose: bool) -> Path:
    """Every log record of this command into `home/logs/<command>-<time>.log`; without `verbose`, Prefect's
    failure tracebacks stay off the terminal (the stop message says where they are). Returns the log path."""
    folder = home / "logs"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{command}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    if not verbose:
        for h in root.handlers:
            h.addFilter(_NoTracebacks())
    root.addHandler(handler)
    return path


def log_exception(path: Path, err: BaseException) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write("".join(traceback.format_exception(err)))


def fail_stopped(lines: list[str], err: BaseException | None = None) -> None:
    """Print the stop lines (after `err`'s traceback when given: --verbose) and exit with STOP_EXIT_CODE."""
    if err is not None:
        typer.echo("".join(traceback.format_exception(err)), err=True)
    typer.echo("\n".join(lines), err=True)
    raise typer.Exit(STOP_EXIT_CODE)
