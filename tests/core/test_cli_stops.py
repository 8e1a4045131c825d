"""`rlvr demo`'s answer to a guard's stop (rlvr_cli/stops.py): one line naming the guard, the step and the setting
to change, then why and where the details are; Prefect's failure tracebacks kept off the terminal but in the log.
The whole path through a real run is tests/e2e/test_demo.py (a run stopped by a guard)."""

from __future__ import annotations

import io
import logging

import pytest

from rlvr_cli import stops
from rlvr_core.experiment.config import demo_config
from rlvr_core.experiment.guards import GuardError, RunStopped
from rlvr_core.grpo.update import check_logprob_temp


def _raised(fn):
    with pytest.raises(Exception) as e:
        fn()
    return e.value


def test_a_recorded_stop_names_guard_step_setting_and_details(tmp_path):
    cfg = demo_config()
    cause = GuardError("G-collapse at step 6: 2 collapse signals over steps 2-6 (need 2): ...")
    record = {"stopped_by": ["G-collapse"], "stopped_at_step": 6, "reasons": "G-collapse at step 6: ...",
              "report": "/a/report.md", "mlflow_run_url": "http://m/#/runs/1", "train_folder": "/c/grpo/k"}
    err = RunStopped(str(cause), record=record)  # what the pipeline flow raises from the stage's error
    first, why, details = stops.stop_lines(err, cfg, "demo", tmp_path / "x.log")
    assert first == (f"rlvr demo: stopped by G-collapse at step 6 of {cfg.grpo.steps}; lower grpo.lr (now 0.0003); "
                     "the thresholds are grpo.guards.health.collapse")
    assert why == "  why: G-collapse at step 6: ..."
    assert details.startswith("  details: report /a/report.md; MLflow http://m/#/runs/1; training summary "
                              "/c/grpo/k/grpo_summary.json; log ")


def test_a_guard_error_raised_before_any_record_is_read_from_its_message():
    # The trainer's own G-logprob-temp check at step 1 (a trainer temperature that is not the engine's).
    cfg = demo_config().model_copy(update={"grpo": demo_config().grpo.model_copy(update={"logprob_temperature": 0.7})})
    err = _raised(lambda: check_logprob_temp(cfg.grpo, step=0, n_tokens=10, diff=0.3, guard_tol=1e-3))
    assert isinstance(err, GuardError) and stops.guard_stop(err) == ("G-logprob-temp", 1)
    first = stops.stop_lines(err, cfg, "demo", None)[0]
    assert first.startswith("rlvr demo: stopped by G-logprob-temp at step 1 of ")
    assert "set grpo.logprob_temperature to 1 (now 0.7)" in first


def test_a_stop_keeps_its_fields_through_pickling():
    """Prefect may pickle a flow's exception (its result): the guard, the step and the record survive."""
    import pickle

    err = pickle.loads(pickle.dumps(GuardError("G-collapse at step 6: ...", guard="G-collapse", step=6)))
    assert (str(err), err.guard, err.step) == ("G-collapse at step 6: ...", "G-collapse", 6)
    record = {"stopped_by": ["G-entropy"], "stopped_at_step": 4, "reasons": "G-entropy at step 4"}
    stop = pickle.loads(pickle.dumps(RunStopped("G-entropy at step 4", record=record)))
    assert stops.guard_stop(stop) == ("G-entropy", 4) and stop.record == record


def test_other_failures_are_not_stops():
    assert stops.guard_stop(ValueError("G-collapse at step 3")) is None
    assert stops.stop_lines(RuntimeError("boom"), demo_config(), "demo", None) is None


def test_prefect_failure_records_stay_off_the_terminal_and_in_the_log(tmp_path):
    # A console handler on the root logger, as Prefect's logging config installs one; a logger of its own under
    # `prefect.` (the real flow and task loggers also carry Prefect's API handler, which needs a live run).
    root, terminal = logging.getLogger(), io.StringIO()
    console = logging.StreamHandler(terminal)
    root.addHandler(console)
    try:
        path = stops.route_logs(tmp_path, "demo", verbose=False)
        try:
            raise GuardError("G-collapse at step 6")
        except GuardError:
            logging.getLogger("prefect.rlvr_stops_test").error("Task run failed", exc_info=True)
        logging.getLogger("prefect.rlvr_stops_test").warning("a warning stays")
        for h in root.handlers:
            h.flush()
    finally:  # leave the process's logging as it was (pytest's own handlers got the filter too)
        root.removeHandler(console)
        for h in list(root.handlers):
            h.filters = [f for f in h.filters if not isinstance(f, stops._NoTracebacks)]
            if isinstance(h, logging.FileHandler) and h.baseFilename.startswith(str(tmp_path)):
                root.removeHandler(h)
                h.close()
    err = terminal.getvalue()
    assert "Task run failed" not in err and "Traceback" not in err and "a warning stays" in err
    text = path.read_text()
    assert path.parent == tmp_path / "logs" and "Task run failed" in text and "GuardError: G-collapse" in text
