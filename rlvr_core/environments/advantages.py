"""Per-turn advantages for multi-turn trajectories (`environment.turn_advantage: to_go`).

The default (`outcome`) is GRPO's: the group-normalised outcome reward on every model token. With per-turn rewards
(an environment's `StepResult.reward`, e.g. `tool_error_reward` for a failed tool call), `to_go` credits each model
turn with what followed it:

    G_i      = R_i + sum_k r_ik                 the trajectory's whole return (outcome + every turn reward)
    G_ik     = R_i + sum_{k' >= k} r_ik'        the return from turn k on (rewards of earlier turns excluded)
    b_i      = mean_{j != i} G_j                the other trajectories' whole returns (leave-one-out)
    A_ik     = (G_ik - b_i) / (std_j G_j + eps) on every token of model turn k

The baseline is the same for every turn of a trajectory and is computed from the *other* trajectories' whole
returns, so it depends neither on this trajectory's actions nor on the turn at which it (or any other) stopped. A
baseline averaged over the trajectories still running at turn k (the common per-turn baseline) changes when some
trajectory stops earlier and biases the gradient towards stopping early or late (verl #7244);
tests/environments/test_turn_advantages.py plants it. Without turn rewards, A_ik = G/(G-1) * (R_i - mean R) / std:
the outcome advantage on every model token, leave-one-out scaled.
"""

from __future__ import annotations

import math

TURN_ADVANTAGES = ("outcome", "to_go")


def turn_to_go_advantages(outcomes: list[float], turn_rewards: list[list[float | None]],
                          eps: float = 1e-6) -> list[list[float]]:
    """Per trajectory of one group, the advantage of each of its model turns (module docstring). A turn without a
    reward (None) counts as 0. A group of one trajectory has no baseline: its advantages are 0."""
    if len(outcomes) != len(turn_rewards):
        raise ValueError(f"{len(outcomes)} outcomes for {len(turn_rewards)} trajectories")
    n = len(outcomes)
    rewards = [[0.0 if r is None else float(r) for r in rs] for rs in turn_rewards]
    whole = [float(o) + sum(rs) for o, rs in zip(outcomes, rewards)]
    if n < 2:
        return [[0.0] * len(rs) for rs in rewards]
    mean = sum(whole) / n
    std = math.sqrt(sum((g - mean) ** 2 for g in whole) / (n - 1))
    out = []
    for i, (o, rs) in enumerate(zip(outcomes, rewards)):
        baseline = (sum(whole) - whole[i]) / (n - 1)
        to_go = [float(o) + sum(rs[k:]) for k in range(len(rs))]
        out.append([(g - baseline) / (std + eps) for g in to_go])
    return out


def token_advantages(turn_advantages: list[float], turn_tokens: list[int], loss_mask: list[int]) -> list[float]:
    """A trajectory's per-token advantages: turn k's advantage on its model ids (the k-th run of `turn_tokens[k]`
    mask-1 positions, in order), 0 on the environment's ids."""
    if sum(turn_tokens) != sum(loss_mask):
        raise ValueError(f"{sum(turn_tokens)} model ids in the turn log, {sum(loss_mask)} in the loss mask")
    owner = [k for k, n in enumerate(turn_tokens) for _ in range(n)]
    out, seen = [], 0
    for m in loss_mask:
        out.append(turn_advantages[owner[seen]] if m else 0.0)
        seen += m
    return out
