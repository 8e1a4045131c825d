"""Multi-turn environments, token-in/token-out: the tools, the loop on a real (tiny, taught) model, the budgets,
and each guard planted (re-encoded history, a dropped separator, observation tokens trained, ids/log-probs/mask of
different lengths)."""

from __future__ import annotations

import pytest
import torch

from env_helpers import TOOL_QA, DroppingEngine, ReencodingEngine
from rlvr_core.core.registry import lookup
from rlvr_core.environments.boundary import TextBoundary
from rlvr_core.environments.checks import EngineContextError, check_train_mask, rerender_drift, step_health
from rlvr_core.environments.loop import Budgets, rollout
from rlvr_core.environments.tools import ToolCall, ToolResult, calculator, parse_call, python_tool, run_call
from rlvr_core.environments.trajectory import Segment, Trajectory, TrajectoryError
from rlvr_core.sampling.base import SamplingParams
from rlvr_core.verifiers import get_verifier

GSM8K = get_verifier("gsm8k")
PROBLEMS = [{"question": "What is 12 * 34?", "gold": "408"}, {"question": "What is 7 * 8?", "gold": "56"}]
KEYS = ["p12x34", "p7x8"]


def score(pairs):
    return [GSM8K.verify(text, gold).reward for text, gold in pairs]


@pytest.fixture(scope="module")
def engine(taught_engine):
    return taught_engine


def tool_env(engine, **kw):
    boundary = TextBoundary(engine.tokenizer, prefix="\n= ", suffix="\n")
    return lookup("environment", "tools")(engine.tokenizer, TOOL_QA, boundary=boundary, tools=["calculator"], **kw)


GREEDY = SamplingParams(n=2, temperature=0.0, max_new_tokens=24, seed=0)


# ------------------------------------------------------------------------------------------------ tools
def test_the_calculator_answers_arithmetic_and_refuses_anything_else_with_an_observation():
    assert calculator("12*34") == ToolResult("408")
    assert calculator("(7 + 8) / 3") == ToolResult("5")
    assert calculator("1/0").error == "error"
    for bad in ("__import__('os')", "2 ** 1000000", "x + 1", "1 +"):
        result = calculator(bad)
        assert result.error == "malformed" and result.text.startswith("error:"), (bad, result)


def test_calls_are_parsed_from_the_markup_and_malformed_ones_answered_not_raised():
    assert parse_call("tag", " <calculator>1+2</calculator>", ["calculator"]) == ToolCall("calculator", "1+2")
    assert parse_call("tag", " 3 + 4 = 7\n#### 7", ["calculator"]) is None
    assert parse_call("tag", " 1+2</calculator>", ["calculator"]).error == "malformed"
    hermes = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
    assert parse_call("hermes", hermes, ["calculator"]) == ToolCall("calculator", "6*7")
    assert parse_call("hermes", "<tool_call>{not json}</tool_call>", ["calculator"]).error == "malformed"
    assert run_call(ToolCall("search", "x"), ["calculator"]).error == "unknown_tool"


def test_the_python_tool_runs_in_the_sandbox_and_returns_plain_text():
    assert python_tool("print(6 * 7)") == ToolResult("42\n")
    failed = python_tool("import os\nprint(os.listdir('/work'))")
    assert failed.error == "error" and "FileNotFoundError" in failed.text  # the checkout is not in its view
    assert python_tool("while True: pass", time_s=1).error == "timeout"


# ------------------------------------------------------------------------------------------------ the loop
def test_single_turn_gives_todays_samples(engine):
    env = lookup("environment", "single_turn")(engine.tokenizer, TOOL_QA, add_special_tokens=False)
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=16, seed=7, stop=TOOL_QA.stop)
    direct = engine.generate([TOOL_QA.render(p["question"]) for p in PROBLEMS], KEYS, params, step=3)
    trajs = rollout(engine, env, PROBLEMS, KEYS, params, Budgets(max_turns=1), score=score, step=3)
    for group, samples in zip(trajs, direct):
        for t, s in zip(group, samples):
            assert t.completion_ids() == s.token_ids and t.logprobs() == s.logprobs and t.text == s.text
            assert t.loss_mask() == [1] * len(s.token_ids) and t.turns == 1


def test_a_tool_call_is_answered_and_the_model_finishes_from_the_stored_ids(engine):
    env = tool_env(engine)
    trajs = rollout(engine, env, PROBLEMS, KEYS, GREEDY, Budgets(max_turns=3, max_total_tokens=96), score=score)
    t = trajs[0][0]
    assert t.tool_calls == 1 and t.tool_errors == 0 and t.turns == 2 and t.end == "done", t
    roles = [s.role for s in t.segments]
    assert roles == ["model", "env", "model"]
    observation = engine.tokenizer.decode(list(t.segments[1].token_ids))
    assert observation == "\n= 408\n"
    assert t.loss_mask() == [1] * len(t.segments[0].token_ids) + [0] * len(t.segments[1].token_ids) + [1] * len(
        t.segments[2].token_ids)
    assert len(t.completion_ids()) == len(t.logprobs()) == len(t.loss_mask())
    assert t.reward == 1.0 and "#### 408" in t.text
    assert rerender_drift(engine.tokenizer, [x for g in trajs for x in g]) == 0.0  # the demo-style boundary
    health = step_health([x for g in trajs for x in g])
    assert health["env/tool_call_rate"] == 1.0 and health["health/G-tool-errors"] == 0.0
    # The turn log the traces show: one entry per model turn, the call with its argument and answer, in time order.
    log = t.turn_log
    assert [(e["turn"], e["tokens"]) for e in log] == [(0, len(t.segments[0].token_ids)), (1, len(t.segments[2].token_ids))]
    call = log[0]["call"]
    assert (call["tool"], call["argument"], call["observation"], call["error"]) == ("calculator", "12*34", "408", None)
    assert log[0]["ns"][1] <= call["ns"][0] <= call["ns"][1] <= log[1]["ns"][0] and "call" not in log[1]


def test_a_budget_cut_is_flagged_and_scored_as_configured(engine):
    env = tool_env(engine)
    for on_cut in ("score", "zero"):
        trajs = rollout(engine, env, PROBLEMS[:1], KEYS[:1], GREEDY, Budgets(max_turns=1, on_cut=on_cut),
                        score=score)
        assert all(t.end == "max_turns" and t.cut for t in trajs[0])
        assert all(t.reward == 0.0 for t in trajs[0])  # an unanswered tool call scores 0 either way
        assert step_health(trajs[0])["health/G-turn-budget"] == 1.0


# ------------------------------------------------------------------------------------------------ guards, planted
class PieceBoundary(TextBoundary):
    """Encodes the observation one character at a time (as an adapter that tokenizes pieces separately does):
    valid ids, but not the ones the tokenizer gives the same text whole, so a re-encoded history differs."""

    def observation_ids(self, observation):
        text = self.prefix + observation + self.suffix
        return [i for c in text for i in self.tokenizer(c, add_special_tokens=False)["input_ids"]]


def test_a_history_decoded_and_encoded_again_stops_the_rollout(engine):
    env = lookup("environment", "tools")(engine.tokenizer, TOOL_QA, tools=["calculator"],
                                         boundary=PieceBoundary(engine.tokenizer, prefix="\nAnswer = ", suffix="\n"))
    stored = rollout(engine, env, PROBLEMS[:1], KEYS[:1], GREEDY, Budgets(max_turns=3), score=score)[0][0]
    assert rerender_drift(engine.tokenizer, [stored]) == 1.0  # decoded and encoded again, the ids differ
    with pytest.raises(EngineContextError, match="G-tito-context: turn 1"):
        rollout(ReencodingEngine(engine), env, PROBLEMS[:1], KEYS[:1], GREEDY, Budgets(max_turns=3), score=score)


def test_a_drifting_boundary_is_flagged_per_step_and_counted_as_an_episode(engine):
    """G-rerender-drift planted: the piecewise boundary drifts every trajectory (flag 1), the demo-style one none
    (flag 0); the flags of the environment's health become the step's per-step flags, counted and kept as episodes
    (health_events) like every other per-step flag, and a single-turn step has none of them."""
    from types import SimpleNamespace

    from rlvr_core.environments.loop import Budgets as B
    from rlvr_core.grpo.step_metrics import ENV_FLAGS, StepGuards, step_flags
    from rlvr_core.sampling.environment_engine import EnvironmentEngine

    problems = [{"question": p["question"]} for p in PROBLEMS]
    prompts = [TOOL_QA.render(p["question"]) for p in problems]
    healths = {}
    for name, boundary in (("pieces", PieceBoundary(engine.tokenizer, prefix="\nAnswer = ", suffix="\n")),
                           ("demo", TextBoundary(engine.tokenizer, prefix="\n= ", suffix="\n"))):
        env = lookup("environment", "tools")(engine.tokenizer, TOOL_QA, tools=["calculator"], boundary=boundary,
                                             add_special_tokens=False)
        wrapped = EnvironmentEngine(engine, env, B(max_turns=3, max_total_tokens=96))
        wrapped.generate(prompts, KEYS, GREEDY)
        healths[name] = wrapped.health([t for _, _, t in wrapped.take()])
    assert healths["pieces"]["health/G-rerender-drift"] == 1.0 and healths["pieces"]["env/rerender_drift"] == 1.0
    assert healths["demo"]["health/G-rerender-drift"] == 0.0 and healths["demo"]["env/noncanonical_share"] == 0.0

    from rlvr_core.experiment.config import GRPOConfig

    cfg = GRPOConfig()
    upd = SimpleNamespace(metrics={"ratio_mean": 1.0, "clip_frac": 0.0, "logprob_mismatch/mean_abs": 0.0},
                          has_reference=False)
    rollouts = SimpleNamespace(stats=[], sizes=torch.tensor([2]), n_groups=1, env=healths["pieces"],
                               status_counts=lambda: {"timeout": 0, "error": 0, "correct": 1},
                               zero_var_share=lambda: 0.0, version=None)
    flags = step_flags(cfg, 0, rollouts, upd, 1e-3)
    assert {g: flags[g] for g in ENV_FLAGS} == {g: int(healths["pieces"][f"health/{g}"]) for g in ENV_FLAGS}
    assert flags["G-rerender-drift"] == 1
    guards = StepGuards([], cfg=cfg)
    assert "G-rerender-drift" in guards.count(flags, 1) and guards.count(flags, 2) == []
    (episode,) = [f for f in guards.firings if f["guard_id"] == "G-rerender-drift"]
    assert (episode["step"], episode["last_step"], episode["source"]) == (1, 2, "step_flags")
    single = step_flags(cfg, 0, SimpleNamespace(**{**vars(rollouts), "env": None}), upd, 1e-3)
    assert not set(single) & set(ENV_FLAGS)


def test_a_dropped_turn_separator_stops_the_rollout(engine):
    env = tool_env(engine)
    separator = engine.tokenizer("\n", add_special_tokens=False)["input_ids"][0]
    with pytest.raises(EngineContextError, match="first difference"):
        rollout(DroppingEngine(engine, separator), env, PROBLEMS[:1], KEYS[:1], GREEDY, Budgets(max_turns=3),
                score=score)


def _two_turns() -> Trajectory:
    t = Trajectory((1, 2, 3))
    t.segments += [Segment("model", (10, 11), 0, (-0.5, -0.25)), Segment("env", (20, 21, 22), 0),
                   Segment("model", (12,), 1, (-1.0,))]
    return t


def test_observation_tokens_trained_as_the_policys_are_refused():
    t = _two_turns()
    check_train_mask(t, t.completion_ids(), t.logprobs(), t.loss_mask(), where="row 0")
    all_ones = [1] * len(t.completion_ids())  # a single-turn builder's mask: every completion token trained
    with pytest.raises(TrajectoryError, match="G-tito-mask: row 0: 3 observation/template tokens"):
        check_train_mask(t, t.completion_ids(), t.logprobs(), all_ones, where="row 0")


def test_ids_logprobs_and_mask_of_different_lengths_are_refused():
    t = _two_turns()
    with pytest.raises(TrajectoryError, match="6 ids, 5 log-probs and 6 mask entries"):
        check_train_mask(t, t.completion_ids(), t.logprobs()[:-1], t.loss_mask(), where="row 0")
    with pytest.raises(TrajectoryError, match="2 ids has 1 log-probs"):
        Segment("model", (1, 2), 0, (-0.1,))
    with pytest.raises(TrajectoryError, match="carries log-probs"):
        Segment("env", (1,), 0, (-0.1,))


def test_one_trajectory_near_its_budget_does_not_shorten_the_others(engine):
    """The later turns of every live trajectory share one engine call: its cap is the roomiest trajectory's and
    each sample is cut at its own trajectory's room (ids and log-probs together), flagged as a budget cut."""
    env = tool_env(engine)
    trajs = rollout(engine, env, PROBLEMS, KEYS, GREEDY, Budgets(max_turns=3, max_total_tokens=24), score=score)
    flat = [t for g in trajs for t in g]
    assert all(len(t.completion_ids()) <= 24 and len(t.completion_ids()) == len(t.logprobs()) for t in flat)
    roomy = rollout(engine, env, PROBLEMS, KEYS, GREEDY, Budgets(max_turns=3, max_total_tokens=96), score=score)
    for short, long in zip(flat, [t for g in roomy for t in g]):  # greedy: the same ids up to the cut
        assert long.completion_ids()[:len(short.completion_ids())] == short.completion_ids()
        assert short.end == ("max_total_tokens" if len(long.completion_ids()) > 24 else long.end)
