"""A multi-turn trajectory (rlvr_core/environments) as the `Sample` the trainer and the evaluator take: every id after
the first prompt, the engine's log-probs on the model's ids (0.0 on the environment's), the loss mask, the first
prompt's ids, and the final turn's text for the verifier. Checked on the way (G-tito-mask)."""

from __future__ import annotations

from rlvr_core.environments.checks import check_train_mask
from rlvr_core.environments.trajectory import Trajectory
from rlvr_core.sampling.base import Sample


def as_sample(traj: Trajectory, prompt_id: str, sample_index: int, seed: int = 0) -> Sample:
    ids, logprobs, mask = traj.completion_ids(), traj.logprobs(), traj.loss_mask()
    check_train_mask(traj, ids, logprobs, mask, where=f"{prompt_id}#{sample_index}")
    versions = [s.weight_version for s in traj.segments if s.role == "model" and s.weight_version is not None]
    return Sample(prompt_id=prompt_id, sample_index=sample_index, text=traj.text, token_ids=ids,
                  finish_reason="stop" if traj.end == "done" else "length", logprobs=logprobs, seed=seed,
                  weight_version=min(versions) if versions else None, prompt_token_ids=list(traj.prompt_ids),
                  loss_mask=mask, env={"turns": traj.turns, "tool_calls": traj.tool_calls,
                                       "tool_errors": traj.tool_errors, "end": traj.end,
                                       "turn_log": traj.turn_log, "turn_rewards": traj.turn_rewards})
