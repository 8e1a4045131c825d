"""The nightly-eval report says which template each checkpoint was trained with and marks a mismatch with the
suite's (G-prompt-mismatch; the flag itself comes from `evaluate_stage`, tests/test_export.py)."""

from flows.nightly_eval import _mismatch_note, _report
from rlvr_core.experiment.config import parse_config


def test_report_marks_a_checkpoint_trained_on_another_template():
    row = {"checkpoint": "exp/run-1/checkpoints/final", "accuracy_greedy": 0.5, "n": 10, "mlflow_run_id": "r1"}
    results = [{**row, "train_template": "minerva@1", "template_mismatch": True},
               {**row, "checkpoint": "exp/run-2/checkpoints/final", "train_template": "qa@1",
                "template_mismatch": False},
               {**row, "checkpoint": "hub/model", "train_template": None, "template_mismatch": False}]
    lines = _report("synthetic@2-x", [r["checkpoint"] for r in results], results).splitlines()
    assert "| trained with |" in lines[4]
    assert lines[6].startswith("| `exp/run-1/checkpoints/final` |") and "`minerva@1` ⚠ template mismatch" in lines[6]
    assert "`qa@1` |" in lines[7] and "⚠" not in lines[7] and "| unknown |" in lines[8]
    assert "**G-prompt-mismatch**" in lines[-1]
    assert "G-prompt-mismatch" not in _report("s", ["a"], results[1:])

    cfg = parse_config({})
    note = _mismatch_note(cfg, {"train_template": "minerva@1", "template_mismatch": True})
    assert "trained with `minerva@1`, evaluated with `qa@1`" in note
    assert _mismatch_note(cfg, {"train_template": "qa@1", "template_mismatch": False}) == ""
