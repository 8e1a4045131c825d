"""The nightly-eval report says which template each checkpoint was trained with and marks a mismatch with the
suite's (G-prompt-mismatch; the flag itself comes from `evaluate_stage`, tests/test_export.py)."""

from flows.nightly_eval import _mismatch_note
from rlvr_core.experiment.config import parse_config
from rlvr_core.eval.compare import EvalSource
from rlvr_core.eval.nightly_report import Evaluated, build_report, to_markdown

C1 = EvalSource("c1", "<test>", [{"benchmark": "synthetic", "problem_id": "p0", "side_by_side": {}, "greedy": True,
                                  "sample_index": 0, "status": "correct"}], {"synthetic": {"verifier": "gsm8k"}})


def test_report_marks_a_checkpoint_trained_on_another_template():
    ckpts = [Evaluated("exp/run-1/checkpoints/final", C1, trained_with="minerva@1", template_mismatch=True),
             Evaluated("exp/run-2/checkpoints/final", C1, trained_with="qa@1"), Evaluated("hub/model", C1)]
    lines = to_markdown(build_report("synthetic@2-x", ckpts, None, n_in_store=3)).splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("| checkpoint |"))
    assert "| trained with |" in lines[head]
    assert lines[head + 2].startswith("| `exp/run-1/checkpoints/final` |")
    assert "`minerva@1` ⚠ template mismatch" in lines[head + 2]
    assert "`qa@1` |" in lines[head + 3] and "⚠" not in lines[head + 3] and "| unknown |" in lines[head + 4]
    assert "**G-prompt-mismatch**" in lines[-1]
    assert "G-prompt-mismatch" not in to_markdown(build_report("s", ckpts[1:], None, n_in_store=2))

    cfg = parse_config({})
    note = _mismatch_note(cfg, {"train_template": "minerva@1", "template_mismatch": True})
    assert "trained with `minerva@1`, evaluated with `qa@1`" in note
    assert _mismatch_note(cfg, {"train_template": "qa@1", "template_mismatch": False}) == ""
