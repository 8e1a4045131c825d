"""A multi-turn evaluation (the held-out evaluation, the nightly one) on the taught tiny model: tool use reported
as metric rows with n and Wilson intervals that agree with the per-sample records, the environment stored in the
settings that change the numbers, and a nightly suite of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from env_helpers import TOOL_QA
from rlvr_core.eval.evaluate import evaluate_spec
from rlvr_core.experiment.config import load_config, parse_config
from rlvr_core.experiment.environment_config import EnvironmentConfig
from rlvr_core.pipeline.evaluation_stage import held_out_spec
from rlvr_core.sampling.environment_engine import with_environment
from rlvr_core.core.stats import wilson_interval

ROOT = Path(__file__).resolve().parents[2]
PROBLEMS = [{"id": f"q{a}x{b}", "question": f"What is {a} * {b}?", "gold": str(a * b), "final_answer": str(a * b)}
            for a, b in ((12, 34), (7, 8), (21, 3), (45, 6), (9, 9), (13, 7))]


@pytest.fixture(scope="module")
def result(taught_engine):
    cfg = parse_config({"prompt": {"template": "qa"}, "environment": {"name": "tools", "max_turns": 3},
                        "eval": {"n_samples": 2, "max_new_tokens": 24}})
    engine = with_environment(cfg.environment, taught_engine, TOOL_QA)
    return evaluate_spec(engine, taught_engine.tokenizer, held_out_spec(cfg), problems=PROBLEMS)


def test_tool_use_is_reported_with_n_and_intervals_that_match_the_samples(result):
    env = result.summary["environment"]
    rows = {r["metric"]: r for r in result.metrics if r["metric"] in
            ("tool_call_rate", "tool_error_share", "cut_share", "turns_mean")}
    assert set(rows) == {"tool_call_rate", "tool_error_share", "cut_share", "turns_mean"}
    greedy = [r for r in result.samples if r["greedy"]]
    assert rows["tool_call_rate"]["n"] == len(greedy) == len(PROBLEMS) == env["n"]
    used = env["used"]
    assert used > 0 and rows["tool_call_rate"]["value"] == used / len(greedy) == env["tool_call_rate"]
    assert (rows["tool_call_rate"]["ci_low"], rows["tool_call_rate"]["ci_high"]) == pytest.approx(
        wilson_interval(used, len(greedy)))
    assert rows["tool_error_share"]["n"] == env["calls"] >= used
    assert rows["turns_mean"]["value"] == env["turns_mean"] >= 1


def test_the_environment_is_stored_with_the_numbers(result):
    settings = result.settings
    assert settings["environment"]["name"] == "tools" and settings["environment"]["max_turns"] == 3
    assert '"environment"' in next(r for r in result.metrics if r["metric"] == "tool_call_rate")["settings"]


def test_a_multi_turn_nightly_suite_is_a_suite_of_its_own():
    from flows.nightly_eval import suite_version

    demo = load_config(ROOT / "configs" / "demo.yaml")
    tools = load_config(ROOT / "configs" / "examples" / "tool-demo.yaml")
    single = tools.model_copy(update={"environment": EnvironmentConfig()})
    assert suite_version(tools) != suite_version(single)
    assert suite_version(demo) == suite_version(demo.model_copy(update={"environment": EnvironmentConfig()}))


def test_the_tool_rows_fit_the_metrics_table(result):
    from rlvr_core.eval.metrics import metrics_table

    table = metrics_table(result.metrics).to_pylist()
    assert {r["metric"] for r in table} >= {"tool_call_rate", "turns_mean", "accuracy_greedy"}
