"""The guards of the multi-turn path (docs/environments.md, "Guards"), each planted in tests/environments/.

- `check_engine_context` (stop): the ids the engine conditioned a turn on differ from the stored trajectory's, the
  symptom of a history decoded and re-encoded somewhere (TRL #5224, #5144) or a dropped turn separator (verl #6501).
- `check_train_mask` (stop): the loss mask built for training is 1 on an observation or template token (tool
  tokens trained as if the policy wrote them), or its length differs from the ids' (TRL #5145).
- `rerender_drift` (per-step rate, flagged over `environment.max_rerender_drift`): the conversation decoded and
  encoded again differs from the stored ids though every model turn is canonical on its own (the boundary's or the
  template's drift); `noncanonical_share`, beside it, counts the policy's own non-canonical pieces.
- `step_health` (per-step shares, flagged over limits): tool calls that timed out or failed; trajectories a budget
  cut (max_turns, max_total_tokens, the per-turn cap, the deadline).
"""

from __future__ import annotations

from typing import Any

from rlvr_core.environments.trajectory import Trajectory, TrajectoryError, check_aligned


class EngineContextError(TrajectoryError):
    """G-tito-context: the engine sampled from ids other than the stored trajectory's."""


def check_engine_context(sample: Any, traj: Trajectory, *, turn: int) -> None:
    given = getattr(sample, "prompt_token_ids", None)
    if given is None:
        raise EngineContextError(f"turn {turn}: the engine did not report the ids it sampled from; multi-turn "
                                 "rollouts need an engine with generate_ids (token-in/token-out)")
    stored = traj.context_ids()
    if list(given) != stored:
        at = next((i for i, (a, b) in enumerate(zip(given, stored)) if a != b), min(len(given), len(stored)))
        raise EngineContextError(
            f"G-tito-context: turn {turn}: the engine sampled from {len(given)} ids, the stored trajectory has "
            f"{len(stored)}; first difference at position {at} (engine {list(given[at:at + 5])}, stored "
            f"{stored[at:at + 5]}): the history was re-encoded or a separator dropped")


def check_train_mask(traj: Trajectory, ids: list[int], logprobs: list[float], mask: list[int], *,
                     where: str) -> None:
    """The training row of `traj` (completion ids, old log-probs, loss mask) against its segments."""
    check_aligned(ids, logprobs, mask, where=where)
    if ids != traj.completion_ids():
        raise TrajectoryError(f"{where}: the training ids are not the trajectory's stored ids")
    wrong = [i for i, (m, want) in enumerate(zip(mask, traj.loss_mask())) if m != want]
    if wrong:
        env_ones = sum(1 for i in wrong if mask[i] == 1)
        raise TrajectoryError(f"G-tito-mask: {where}: {env_ones} observation/template tokens have loss mask 1 and "
                              f"{len(wrong) - env_ones} model tokens mask 0 (first at position {wrong[0]})")


def _round_trips(tokenizer: Any, ids: list[int]) -> bool:
    text = tokenizer.decode(ids, skip_special_tokens=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) == list(ids)


def noncanonical_share(tokenizer: Any, trajectories: list[Trajectory]) -> float:
    """Share of trajectories with a model turn whose sampled ids are not how the tokenizer would write its text
    (`calc` `ulator` for `calculator`): a policy at temperature > 0 samples such pieces; they are trained as sampled,
    where a decode-and-encode pipeline would silently have changed them."""
    if not trajectories:
        return 0.0
    return sum(any(s.role == "model" and not _round_trips(tokenizer, list(s.token_ids)) for s in t.segments)
               for t in trajectories) / len(trajectories)


def rerender_drift(tokenizer: Any, trajectories: list[Trajectory]) -> float:
    """Share of trajectories whose ids, decoded and encoded again, are not the stored ids although each model turn
    is canonical on its own: the drift the boundary or template adds (a seam that merges, a separator written
    otherwise), not the policy's own non-canonical pieces (`noncanonical_share`)."""
    if not trajectories:
        return 0.0
    drifted = 0
    for t in trajectories:
        own = all(_round_trips(tokenizer, list(s.token_ids)) for s in t.segments if s.role == "model")
        drifted += int(own and not _round_trips(tokenizer, t.context_ids()))
    return drifted / len(trajectories)


def step_health(trajectories: list[Trajectory], *, max_tool_error_share: float = 0.2,
                max_cut_share: float = 0.2) -> dict[str, float]:
    """The step's multi-turn metrics (`env/...`) and their flags (`health/G-tool-errors`, `health/G-turn-budget`)."""
    n = len(trajectories)
    calls = sum(t.tool_calls for t in trajectories)
    errors = sum(t.tool_errors for t in trajectories)
    cut = sum(t.cut for t in trajectories)
    error_share = errors / calls if calls else 0.0
    cut_share = cut / n if n else 0.0
    return {
        "env/turns_mean": sum(t.turns for t in trajectories) / n if n else 0.0,
        "env/tool_calls_per_trajectory": calls / n if n else 0.0,
        "env/tool_call_rate": sum(t.tool_calls > 0 for t in trajectories) / n if n else 0.0,
        "env/tool_error_share": error_share,
        "env/cut_share": cut_share,
        "health/G-tool-errors": float(calls > 0 and error_share > max_tool_error_share),
        "health/G-turn-budget": float(cut_share > max_cut_share),
    }
