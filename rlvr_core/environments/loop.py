"""The multi-turn rollout: an engine and an environment, turn by turn, to the end of every trajectory.

Turn 0 samples each problem `params.n` times in one request, exactly as the single-turn path does (same request
seeds), so the `single_turn` environment gives today's samples. Later turns sample each live trajectory once, from
its stored ids (`Trajectory.context_ids`), with a request seed of its own (the prompt key, turn and sample index).
The engine must take token ids (`generate_ids`) and report the ids each sample was conditioned on; the loop checks
them against the stored trajectory (`checks.check_engine_context`) and stops on a difference.

Budgets are explicit: `max_turns`, `max_total_tokens` (every id after the first prompt), the engine's per-turn
`max_new_tokens`, a per-rollout wall-clock `deadline_s`. A trajectory a budget ends is marked with why
(`Trajectory.end`), scored as `on_cut` says (`score`: its last turn is verified as it stands; `zero`: reward 0),
and counted per step (`checks.step_health`), never a silent 0.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Callable

from rlvr_core.environments.checks import check_engine_context
from rlvr_core.environments.trajectory import Segment, Trajectory

ON_CUT = ("score", "zero")


@dataclass(frozen=True)
class Budgets:
    max_turns: int = 4
    max_total_tokens: int = 512
    deadline_s: float | None = None
    on_cut: str = "score"

    def __post_init__(self) -> None:
        if self.max_turns < 1 or self.max_total_tokens < 1:
            raise ValueError(f"max_turns and max_total_tokens must be >= 1, got {self.max_turns}, "
                             f"{self.max_total_tokens}")
        if self.deadline_s is not None and self.deadline_s <= 0:
            raise ValueError(f"deadline_s must be > 0 or None, got {self.deadline_s}")
        if self.on_cut not in ON_CUT:
            raise ValueError(f"on_cut must be one of {', '.join(ON_CUT)}, got {self.on_cut!r}")


@dataclass
class _Live:
    problem: int
    sample: int
    traj: Trajectory


def rollout(engine: Any, env: Any, problems: list[dict], keys: list[str], params: Any, budgets: Budgets, *,
            score: Callable[[list[tuple[str, Any]]], list[float]], step: int = 0, epoch: int = 0,
            tools_log: Callable[[dict], None] | None = None) -> list[list[Trajectory]]:
    """`params.n` trajectories per problem (input order), from `env.reset`, each scored: `score([(final text,
    gold), ...])` gives the rewards (the verifier pool's, mapped to rewards)."""
    trajs = run_turns(engine, env, [list(env.reset(p)) for p in problems], keys, params, budgets, step=step,
                      epoch=epoch, tools_log=tools_log)
    score_trajectories(trajs, [p["gold"] for p in problems], score, budgets)
    return trajs


def run_turns(engine: Any, env: Any, prompts: list[list[int]], keys: list[str], params: Any, budgets: Budgets, *,
              step: int = 0, epoch: int = 0, first_sample_index: int = 0,
              tools_log: Callable[[dict], None] | None = None) -> list[list[Trajectory]]:
    """`params.n` unscored trajectories per first prompt (given as ids), samples numbered from
    `first_sample_index` (the engine's own numbering, so request seeds match a single-turn call's)."""
    started = time.monotonic()
    turn_params = replace(params, stop=tuple(dict.fromkeys((*params.stop, *env.stop))))
    t0 = time.time_ns()
    first = engine.generate_ids(prompts, keys, turn_params, step=step, epoch=epoch,
                                first_sample_index=first_sample_index)
    sampled_ns = (t0, time.time_ns())
    live = [_Live(i, s, Trajectory(tuple(prompts[i]))) for i in range(len(prompts)) for s in range(params.n)]
    samples = [first[x.problem][x.sample] for x in live]
    for x, sample in zip(live, samples):
        x.traj.seed = sample.seed
    done: list[_Live] = []
    for turn in range(budgets.max_turns):
        live = _take_turn(env, live, samples, turn, budgets, done, tools_log, sampled_ns)
        if not live:
            break
        if budgets.deadline_s is not None and time.monotonic() - started > budgets.deadline_s:
            _end(live, "deadline", done)
            break
        if turn + 1 == budgets.max_turns:
            _end(live, "max_turns", done)
            break
        t0 = time.time_ns()
        samples = _sample_next(engine, live, keys, turn_params, turn + 1, budgets, step, epoch,
                               first_sample_index)
        sampled_ns = (t0, time.time_ns())
    out: list[list[Trajectory]] = [[None] * params.n for _ in prompts]  # type: ignore[list-item]
    for x in done:
        out[x.problem][x.sample] = x.traj
    return out


def score_trajectories(trajs: list[list[Trajectory]], golds: list[Any], score: Callable, budgets: Budgets) -> None:
    """Set each trajectory's reward: its final turn verified, or 0 for a cut one under `on_cut: zero`."""
    flat = [(t, gold) for group, gold in zip(trajs, golds) for t in group]
    judged = [(t, g) for t, g in flat if not (t.cut and budgets.on_cut == "zero")]
    rewards = score([(t.text, g) for t, g in judged]) if judged else []
    for (t, _), reward in zip(judged, rewards):
        t.reward = float(reward)
    for t, _ in flat:
        if t.cut and budgets.on_cut == "zero":
            t.reward = 0.0


def _take_turn(env: Any, live: list[_Live], samples: list[Any], turn: int, budgets: Budgets, done: list[_Live],
               tools_log: Callable[[dict], None] | None, sampled_ns: tuple[int, int]) -> list[_Live]:
    """Append each sample as a model segment and the environment's answer; return the trajectories still live.
    `sampled_ns`: when the engine call that sampled this turn ran (the turn log's)."""
    still = []
    for x, sample in zip(live, samples):
        check_engine_context(sample, x.traj, turn=turn)
        room = budgets.max_total_tokens - len(x.traj.completion_ids())
        ids, logprobs = tuple(sample.token_ids), tuple(sample.logprobs)
        x.traj.segments.append(Segment("model", ids[:room], turn, logprobs[:room], sample.weight_version))
        x.traj.text = sample.text
        x.traj.turn_log.append({"turn": turn, "text": sample.text, "tokens": min(len(ids), room), "ns": sampled_ns})
        if len(ids) > room:  # sampled past this trajectory's share of the call's cap: cut, ids and log-probs together
            x.traj.text = env_text(env, ids[:room])
            _end([x], "max_total_tokens", done)
            continue
        if sample.finish_reason == "length":
            _end([x], "length", done)
            continue
        t_tool = time.time_ns()
        answer = env.step(list(sample.token_ids))
        x.traj.turn_rewards.append(answer.reward)
        if answer.tool is not None:
            x.traj.tool_calls += 1
            x.traj.tool_errors += int(answer.tool_error is not None)
            x.traj.turn_log[-1]["call"] = {"tool": answer.tool, "argument": answer.argument,
                                           "observation": answer.observation, "error": answer.tool_error,
                                           "ns": (t_tool, time.time_ns())}
            if tools_log is not None:
                tools_log({"problem": x.problem, "sample": x.sample, "turn": turn, "tool": answer.tool,
                           "error": answer.tool_error})
        if answer.done:
            _end([x], "done", done)
            continue
        x.traj.segments.append(Segment("env", tuple(answer.observation_ids), turn))
        if len(x.traj.completion_ids()) >= budgets.max_total_tokens:
            _end([x], "max_total_tokens", done)
            continue
        still.append(x)
    return still


def _sample_next(engine: Any, live: list[_Live], keys: list[str], params: Any, turn: int, budgets: Budgets,
                 step: int, epoch: int, first_sample_index: int) -> list[Any]:
    """One sample per live trajectory from its stored ids, in one engine call whose token cap is the roomiest
    trajectory's (`_take_turn` cuts each sample at its own trajectory's room): one trajectory near its budget
    does not shorten every other trajectory's turn."""
    room = max(budgets.max_total_tokens - len(x.traj.completion_ids()) for x in live)
    turn_params = replace(params, n=1, max_new_tokens=max(1, min(params.max_new_tokens, room)))
    contexts = [x.traj.context_ids() for x in live]
    ids = [f"{keys[x.problem]}/turn{turn}/sample{first_sample_index + x.sample}" for x in live]
    return [group[0] for group in engine.generate_ids(contexts, ids, turn_params, step=step, epoch=epoch)]


def env_text(env: Any, ids: tuple[int, ...]) -> str:
    """The text of ids cut short, for the verifier (decoded only to be read)."""
    return env.tokenizer.decode(list(ids), skip_special_tokens=True)


def _end(xs: list[_Live], why: str, done: list[_Live]) -> None:
    for x in xs:
        x.traj.end = why
        done.append(x)
