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
    """`params.n` trajectories per problem (input order), each scored: `score([(final text, gold), ...])` gives
    the rewards (the verifier pool's `verify_many`, mapped to rewards)."""
    started = time.monotonic()
    turn_params = replace(params, stop=tuple(dict.fromkeys((*params.stop, *env.stop))))
    prompts = [list(env.reset(p)) for p in problems]
    first = engine.generate_ids(prompts, keys, turn_params, step=step, epoch=epoch)
    live = [_Live(i, s, Trajectory(tuple(prompts[i]))) for i in range(len(problems)) for s in range(params.n)]
    samples = [first[x.problem][x.sample] for x in live]
    done: list[_Live] = []
    for turn in range(budgets.max_turns):
        live = _take_turn(env, live, samples, turn, budgets, done, tools_log)
        if not live:
            break
        if budgets.deadline_s is not None and time.monotonic() - started > budgets.deadline_s:
            _end(live, "deadline", done)
            live = []
            break
        if turn + 1 == budgets.max_turns:
            _end(live, "max_turns", done)
            live = []
            break
        samples = _sample_next(engine, live, keys, turn_params, turn + 1, budgets, step, epoch)
    _score(done, problems, score, budgets)
    out: list[list[Trajectory]] = [[None] * params.n for _ in problems]  # type: ignore[list-item]
    for x in done:
        out[x.problem][x.sample] = x.traj
    return out


def _take_turn(env: Any, live: list[_Live], samples: list[Any], turn: int, budgets: Budgets, done: list[_Live],
               tools_log: Callable[[dict], None] | None) -> list[_Live]:
    """Append each sample as a model segment and the environment's answer; return the trajectories still live."""
    still = []
    for x, sample in zip(live, samples):
        check_engine_context(sample, x.traj, turn=turn)
        x.traj.segments.append(Segment("model", tuple(sample.token_ids), turn, tuple(sample.logprobs),
                                       sample.weight_version))
        x.traj.text = sample.text
        if sample.finish_reason == "length":
            _end([x], "length", done)
            continue
        answer = env.step(list(sample.token_ids))
        x.traj.turn_rewards.append(None)
        if answer.tool is not None:
            x.traj.tool_calls += 1
            x.traj.tool_errors += int(answer.tool_error is not None)
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
                 step: int, epoch: int) -> list[Any]:
    """One sample per live trajectory from its stored ids; the turn's token cap leaves room in the total budget."""
    room = min(budgets.max_total_tokens - len(x.traj.completion_ids()) for x in live)
    turn_params = replace(params, n=1, max_new_tokens=max(1, min(params.max_new_tokens, room)))
    contexts = [x.traj.context_ids() for x in live]
    ids = [f"{keys[x.problem]}/turn{turn}/sample{x.sample}" for x in live]
    return [group[0] for group in engine.generate_ids(contexts, ids, turn_params, step=step, epoch=epoch)]


def _end(xs: list[_Live], why: str, done: list[_Live]) -> None:
    for x in xs:
        x.traj.end = why
        done.append(x)


def _score(done: list[_Live], problems: list[dict], score: Callable, budgets: Budgets) -> None:
    judged = [x for x in done if not (x.traj.cut and budgets.on_cut == "zero")]
    rewards = score([(x.traj.text, problems[x.problem]["gold"]) for x in judged]) if judged else []
    for x, reward in zip(judged, rewards):
        x.traj.reward = float(reward)
    for x in done:
        if x.traj.cut and budgets.on_cut == "zero":
            x.traj.reward = 0.0
