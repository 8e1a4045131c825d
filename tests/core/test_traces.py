"""Rollout traces (rlvr_core/pipeline/traces.py): which steps are traced, and what a trace holds once written to a
real MLflow sqlite store and read back with `MlflowClient().search_traces`."""

from __future__ import annotations

import json

import pytest

from rlvr_core.experiment.config import ConfigError, TracesConfig, parse_config
from rlvr_core.grpo.rollouts import GroupStats, RolloutBatch, RolloutGroup
from rlvr_core.pipeline.traces import TraceSink, fresh_flags, traced_reason
from rlvr_core.sampling.base import Sample
from rlvr_core.verifiers.base import Outcome, Status


def test_traced_steps_follow_the_policy():
    every_eval = TracesConfig()
    # evaluation every 40 steps of 120: steps 40, 80, 120; a flagged step is traced whatever its number
    assert [s for s in range(1, 121) if traced_reason(every_eval, s, 120, 40, [])] == [40, 80, 120]
    assert traced_reason(every_eval, 7, 120, 40, ["G-kl-explosion"]) == "flagged"
    assert traced_reason(TracesConfig(flagged=False), 7, 120, 40, ["G-kl-explosion"]) is None
    assert [s for s in range(1, 11) if traced_reason(every_eval, s, 10, 0, [])] == [10]  # eval only after the last
    assert [s for s in range(1, 11) if traced_reason(TracesConfig(every=3), s, 10, 0, [])] == [3, 6, 9, 10]
    assert not [s for s in range(1, 11) if traced_reason(TracesConfig(every=0), s, 10, 4, [])]
    assert traced_reason(TracesConfig(enabled=False), 7, 120, 40, ["G-kl-explosion"]) is None


def test_a_guard_flagging_step_after_step_is_traced_once_per_cooldown():
    """A guard that flags steps 3-12 in a row traces its steps 3 and 8 in full (cooldown 5); another guard's first
    flag (step 6) is traced at once; cooldown 0 traces every flagged step."""
    policy, last = TracesConfig(flagged_cooldown=5), {}
    flags = {s: ["G-kl-explosion"] + (["G-entropy"] if s == 6 else []) for s in range(3, 13)}
    full = {s: fresh_flags(last, s, flags.get(s, []), policy) for s in range(1, 15)}
    assert {s: f for s, f in full.items() if f} == {3: ["G-kl-explosion"], 6: ["G-entropy"], 8: ["G-kl-explosion"]}
    assert [s for s in range(1, 15) if traced_reason(policy, s, 14, 0, full[s])] == [3, 6, 8, 14]
    every, last = TracesConfig(flagged_cooldown=0), {}
    assert all(fresh_flags(last, s, flags[s], every) for s in flags)


@pytest.mark.parametrize("value, why", [({"every": -2}, "tracking.traces.every: must be 'eval' or an integer >= 0"),
                                        ({"groups_per_step": -1}, "tracking.traces.groups_per_step"),
                                        ({"eval_wrong": "x"}, "tracking.traces.eval_wrong"),
                                        ({"groups": 4}, "tracking.traces.groups: unknown key")])
def test_bad_trace_settings_name_file_and_field(value, why):
    with pytest.raises(ConfigError) as e:
        parse_config({"tracking": {"traces": value}}, "exp.yaml")
    assert f"exp.yaml: {why}" in str(e.value)


def _batch(step: int, texts: list[list[str]], rewards: list[list[float]]) -> RolloutBatch:
    groups = {}
    for j, (ts, rs) in enumerate(zip(texts, rewards)):
        samples = [Sample(f"p{j}", i, t, list(range(3 + i)), "stop" if i else "length", [0.0] * (3 + i), 7)
                   for i, t in enumerate(ts)]
        outcomes = [Outcome(Status.CORRECT if r else Status.INCORRECT, r, "4" if r else "5", "gsm8k", "1",
                            detail=f"detail {i}") for i, r in enumerate(rs)]
        stats = GroupStats(tuple(rs), (0.0,) * len(rs), 1.0, 10, 0, (0,) * 5)
        groups[j] = RolloutGroup(j, j, {"id": f"p{j}", "question": "2+2?", "final_answer": "4"}, f"Q{j}: 2+2?",
                                 samples, outcomes, stats)
    return RolloutBatch(groups, [g.stats for g in groups.values()], list(groups), 1, 0, len(texts[0]), 0.1)


@pytest.fixture
def mlflow_run(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("traces", artifact_location=str(tmp_path / "art"))
    return uri, client, exp, client.create_run(exp).info.run_id


def _row(step: int, **flags: int) -> dict:
    return {"step": step, "t_rollout_s": 0.2, "t_reward_s": 0.1, "t_train_s": 0.3,
            **{f"health/{g}": v for g, v in {"G-fixed-seed": 0, **flags}.items()}}


def test_sink_writes_searchable_traces_that_hold_each_completion(mlflow_run):
    uri, client, exp, run = mlflow_run
    policy = TracesConfig(groups_per_step=2, every="eval", eval_wrong=1)
    secret = "see http://user:hunter2@example.com"
    with TraceSink(run, uri, policy, last_step=4, eval_interval=2) as sink:
        for step in (1, 2, 3):
            texts = [[f"s{step} g{j} c{i}" for i in range(3)] for j in range(3)]
            texts[0][1] += " " + secret
            flags = {"G-verifier-error": 1} if step == 3 else {}
            if step == 2:  # the periodic evaluation runs before its step's row arrives
                sink.on_samples([{"problem_id": "t1", "sample_index": 0, "greedy": True, "response": "6",
                                  "status": "incorrect", "reward": 0.0, "extracted": "6", "length": 2,
                                  "finish_reason": "stop"},
                                 {"problem_id": "t2", "sample_index": 0, "greedy": True, "response": "9",
                                  "status": "incorrect", "reward": 0.0, "extracted": "9", "length": 2,
                                  "finish_reason": "stop"}], [{"id": "t1", "question": "3+3?"}], 0)
            sink(_row(step, **flags), _batch(step, texts, [[1.0, 0.0, 1.0], [0.0] * 3, [1.0] * 3]))
    assert sink.sent == 2 + 1 + 3 and sink.dropped == 0
    traces = client.search_traces(locations=[exp], run_id=run, max_results=100)
    by_step = {}
    for t in traces:
        by_step.setdefault((t.info.tags["rlvr.kind"], t.info.tags["step"]), []).append(t)
    # step 1: not an eval step; step 2: 2 of 3 groups + 1 wrong eval sample; step 3: flagged, every group
    assert {k: len(v) for k, v in by_step.items()} == {("rollout", "2"): 2, ("eval", "2"): 1, ("rollout", "3"): 3}
    step2 = client.search_traces(locations=[exp], filter_string="tags.step = '2' and tags.`rlvr.kind` = 'rollout'")
    assert sorted(t.info.tags["prompt_id"] for t in step2) == ["p0", "p1"]
    t = next(t for t in step2 if t.info.tags["prompt_id"] == "p0")
    assert t.info.trace_metadata["mlflow.sourceRun"] == run
    assert t.info.tags["reward_mean"] == "0.6667" and t.info.tags["n_correct"] == "2"
    spans = {s.name: s for s in t.data.spans}
    assert set(spans) == {"rollout step 2 p0", "sample", "verify"}
    rows = spans["rollout step 2 p0"].outputs
    assert [r["completion"] for r in rows] == ["s2 g0 c0", "s2 g0 c1 see http://user:***@example.com", "s2 g0 c2"]
    assert [r["reward"] for r in rows] == [1.0, 0.0, 1.0]
    assert [(r["status"], r["detail"], r["length"], r["finish_reason"], r["weight_version"]) for r in rows][:2] == [
        ("correct", "detail 0", 3, "length", 1), ("incorrect", "detail 1", 4, "stop", 1)]
    assert spans["rollout step 2 p0"].inputs["prompt"] == "Q0: 2+2?" and spans["verify"].inputs["gold"] == "4"
    assert spans["sample"].parent_id == spans["verify"].parent_id == spans["rollout step 2 p0"].span_id
    assert spans["sample"].end_time_ns <= spans["verify"].start_time_ns
    assert "hunter2" not in json.dumps([s.to_dict() for t in traces for s in t.data.spans])
    flagged = client.search_traces(locations=[exp], filter_string="tags.flagged = 'G-verifier-error'")
    assert len(flagged) == 3
    wrong = by_step[("eval", "2")][0]
    assert wrong.info.tags["prompt_id"] == "t1" and wrong.data.spans[0].inputs["prompt"] == "3+3?"
    # The "Request" column (MLflow's traces table shows no tag by default) says kind and step first.
    assert wrong.info.request_preview == "[eval step 2 t1] 3+3?", wrong.info.request_preview
    assert t.info.request_preview == "[rollout step 2 p0] Q0: 2+2?", t.info.request_preview


def test_nothing_is_written_when_traces_are_off(mlflow_run):
    uri, client, exp, run = mlflow_run
    with TraceSink(run, uri, TracesConfig(enabled=False), last_step=2, eval_interval=1) as sink:
        sink(_row(2, **{"G-verifier-error": 1}), _batch(2, [["a"]], [[1.0]]))
    assert sink.sent == 0 and len(client.search_traces(locations=[exp])) == 0


def test_a_multi_turn_rollout_shows_a_span_per_turn_and_a_child_span_per_tool_call(mlflow_run):
    """The turn log the tools loop keeps (rlvr_core/environments/loop.py) becomes spans under `sample`: turn 0 with
    its calculator call as a child, turn 1 (the answer) without one; a single-turn completion gets none."""
    uri, client, exp, run = mlflow_run
    batch = _batch(4, [["#### 408", "#### 9"]], [[1.0, 0.0]])
    log = [{"turn": 0, "text": " <calculator>12*34</calculator>", "tokens": 9, "ns": (1_000, 2_000),
            "call": {"tool": "calculator", "argument": "12*34", "observation": "408", "error": None,
                     "ns": (2_100, 2_200)}},
           {"turn": 1, "text": "#### 408", "tokens": 4, "ns": (3_000, 4_000)}]
    first = batch.local[0].samples[0]
    batch.local[0].samples[0] = Sample(first.prompt_id, 0, first.text, first.token_ids, "stop", first.logprobs, 7,
                                       env={"turns": 2, "tool_calls": 1, "tool_errors": 0, "end": "done",
                                            "turn_log": log})
    with TraceSink(run, uri, TracesConfig(every=1), last_step=4, eval_interval=0) as sink:
        sink(_row(4), batch)
    (trace,) = client.search_traces(locations=[exp], run_id=run)
    spans = {s.name: s for s in trace.data.spans}
    assert set(spans) == {"rollout step 4 p0", "sample", "verify", "turn 0 · sample 0", "turn 1 · sample 0",
                          "tool calculator"}
    assert spans["turn 0 · sample 0"].parent_id == spans["turn 1 · sample 0"].parent_id == spans["sample"].span_id
    tool = spans["tool calculator"]
    assert tool.parent_id == spans["turn 0 · sample 0"].span_id and tool.span_type == "TOOL"
    assert tool.inputs == {"argument": "12*34"} and tool.outputs == {"observation": "408", "error": None}
    assert (tool.start_time_ns, tool.end_time_ns) == (2_100, 2_200)
    assert spans["turn 1 · sample 0"].outputs == {"text": "#### 408", "tokens": 4}
