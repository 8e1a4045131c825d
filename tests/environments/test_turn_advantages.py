"""Per-turn advantages (`environment.turn_advantage: to_go`, rlvr_core/environments/advantages.py): a hand-worked
group, the outcome case against the GRPO estimator of rlvr_core/grpo (independent code), a baseline that does not move
when a trajectory stops at another turn (the biased per-turn baseline of verl #7244 planted, and caught), and the
turn-to-token mapping."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from rlvr_core.environments.advantages import token_advantages, turn_to_go_advantages
from rlvr_core.grpo.advantages import get_advantage


def test_a_hand_worked_group():
    # Whole returns 1, -0.5, 0; the second trajectory's first tool call failed (turn reward -0.5).
    got = turn_to_go_advantages([1.0, 0.0, 0.0], [[None, None], [-0.5, None], [None]])
    std = statistics.stdev([1.0, -0.5, 0.0])
    want = [[(1 - (-0.25)) / std, (1 - (-0.25)) / std],
            [(-0.5 - 0.5) / std, (0.0 - 0.5) / std],  # turn 1 is not charged for turn 0's failure
            [(0.0 - 0.25) / std]]
    for g, w in zip(got, want):
        assert g == pytest.approx(w, abs=1e-5)


def test_without_turn_rewards_it_is_the_outcome_advantage_leave_one_out_scaled():
    outcomes = [1.0, 0.0, 1.0, 1.0, 0.0]
    got = turn_to_go_advantages(outcomes, [[None] * k for k in (1, 2, 3, 1, 2)])
    grpo = get_advantage("grpo")(torch.tensor([outcomes]), eps=1e-6)[0].tolist()
    G = len(outcomes)
    for turns, a in zip(got, grpo):
        assert turns == pytest.approx([G / (G - 1) * a] * len(turns), abs=1e-5)


def _alive_baseline(outcomes, turn_rewards):
    """The planted bug: turn k's baseline is the mean return-to-go of the trajectories still running at turn k."""
    to_go = [[o + sum(rs[k:]) for k in range(len(rs))] for o, rs in zip(outcomes, turn_rewards)]
    out = []
    for i, rs in enumerate(to_go):
        row = []
        for k, g in enumerate(rs):
            alive = [t[k] for t in to_go if len(t) > k]
            row.append(g - sum(alive) / len(alive))
        out.append(row)
    return out


@pytest.mark.parametrize("estimator, independent", [(turn_to_go_advantages, True), (_alive_baseline, False)])
def test_the_baseline_does_not_depend_on_when_another_trajectory_stopped(estimator, independent):
    """The same returns, but the third trajectory answers at once instead of after a harmless extra turn: the first
    trajectory's advantages must not change (they do under the alive-at-turn-k baseline)."""
    outcomes = [1.0, 0.0, 0.0]
    long = estimator(outcomes, [[0.0, 0.0], [-0.5, 0.0], [0.0, 0.0]])
    short = estimator(outcomes, [[0.0, 0.0], [-0.5, 0.0], [0.0]])
    assert (long[0] == pytest.approx(short[0], abs=1e-9)) is independent
    assert (long[1] == pytest.approx(short[1], abs=1e-9)) is independent


def test_a_group_of_one_has_no_baseline():
    assert turn_to_go_advantages([1.0], [[None, -1.0]]) == [[0.0, 0.0]]
    with pytest.raises(ValueError, match="2 outcomes for 1 trajectories"):
        turn_to_go_advantages([1.0, 0.0], [[None]])


def test_each_turns_advantage_lands_on_its_own_model_ids():
    assert token_advantages([0.5, -1.0], [2, 1], [1, 1, 0, 0, 0, 1]) == [0.5, 0.5, 0.0, 0.0, 0.0, -1.0]
    with pytest.raises(ValueError, match="3 model ids in the turn log, 2 in the loss mask"):
        token_advantages([0.5, -1.0], [2, 1], [1, 0, 1])
    assert not any(math.isnan(x) for x in token_advantages([0.0], [1], [1]))
