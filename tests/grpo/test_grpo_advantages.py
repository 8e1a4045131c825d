"""Advantage estimators, token broadcast, DAPO overlong penalty and Δlog p weights vs independent references.

References are naive per-element Python loops written from the papers' formulas (statistics.stdev is the
unbiased sample std) and hand-worked examples with the arithmetic in comments.
"""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from rlvr_core.grpo import (advantages_to_tokens, dr_grpo_advantages, get_advantage, grpo_advantages, known_advantages,
                            lowprob_token_weights, overlong_penalty, rloo_advantages, weight_negative_advantages)


def _naive(rewards: list[list[float]], kind: str, eps: float = 1e-6) -> list[list[float]]:
    out = []
    for group in rewards:
        g = len(group)
        mean = sum(group) / g
        row = []
        for i, r in enumerate(group):
            if kind == "grpo":
                row.append(0.0 if len(set(group)) == 1 else (r - mean) / (statistics.stdev(group) + eps))
            elif kind == "dr_grpo":
                row.append(r - mean)
            else:  # rloo: baseline = mean of the other G-1 rewards
                row.append(r - sum(group[j] for j in range(g) if j != i) / (g - 1))
        out.append(row)
    return out


@pytest.mark.parametrize("kind", ["grpo", "dr_grpo", "rloo"])
def test_matches_naive_loop(kind):
    gen = torch.Generator().manual_seed(0)
    rewards = torch.rand(4, 5, generator=gen, dtype=torch.float64)
    rewards[1] = 0.5  # one zero-variance group
    expected = torch.tensor(_naive(rewards.tolist(), kind), dtype=torch.float64)
    fn = get_advantage(kind)
    torch.testing.assert_close(fn(rewards), expected, rtol=1e-12, atol=1e-12)
    # the flat (B*G,) layout with group_size gives the same numbers, flat
    torch.testing.assert_close(fn(rewards.reshape(-1), 5), expected.reshape(-1), rtol=1e-12, atol=1e-12)


def test_grpo_hand_example():
    # rewards [1, 0, 0, 0]: mean 0.25; unbiased var = (0.75^2 + 3 * 0.25^2) / 3 = (0.5625 + 0.1875) / 3 = 0.25,
    # std 0.5 -> A = [0.75/0.5, -0.25/0.5, ...] = [1.5, -0.5, -0.5, -0.5] (eps=1e-6 shifts the 7th digit).
    adv = grpo_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    torch.testing.assert_close(adv, torch.tensor([[1.5, -0.5, -0.5, -0.5]]), rtol=1e-5, atol=1e-5)
    # Dr.GRPO: r - mean = [0.75, -0.25, -0.25, -0.25]
    torch.testing.assert_close(dr_grpo_advantages(torch.tensor([[1.0, 0, 0, 0]])),
                               torch.tensor([[0.75, -0.25, -0.25, -0.25]]))
    # RLOO: 1 - mean(0,0,0) = 1; 0 - mean(1,0,0) = -1/3
    torch.testing.assert_close(rloo_advantages(torch.tensor([[1.0, 0, 0, 0]])),
                               torch.tensor([[1.0, -1 / 3, -1 / 3, -1 / 3]]))


def test_zero_variance_group_is_exactly_zero():
    # 0.1 repeated: float32 mean of 7 copies is not exactly 0.1, and (r - mean) / 1e-6 would be ~0.01.
    r = torch.full((1, 7), 0.1)
    for name in known_advantages():
        assert torch.equal(get_advantage(name)(r), torch.zeros(1, 7)), name


def test_rloo_is_scaled_dr_grpo():
    r = torch.rand(3, 6, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(rloo_advantages(r), dr_grpo_advantages(r) * 6 / 5)


def test_ragged_groups_by_id_match_per_group_computation():
    # adaptive sampling gives prompts different numbers of completions; ids are arbitrary and interleaved
    rewards = torch.tensor([1.0, 0.0, 3.0, 1.0, 0.0, 2.0, 5.0], dtype=torch.float64)
    ids = torch.tensor([7, 7, 2, 7, 2, 2, 2])
    for kind in ("grpo", "dr_grpo", "rloo"):
        out = get_advantage(kind)(rewards, group_ids=ids)
        for gid in (7, 2):
            sel = ids == gid
            expected = torch.tensor(_naive([rewards[sel].tolist()], kind)[0], dtype=torch.float64)
            torch.testing.assert_close(out[sel], expected)


def test_bad_groupings_fail_loudly():
    with pytest.raises(ValueError, match="at least 2"):
        grpo_advantages(torch.tensor([[1.0], [0.0]]))
    with pytest.raises(ValueError, match="groups of 3"):
        grpo_advantages(torch.zeros(7), 3)
    with pytest.raises(ValueError, match="exactly one"):
        grpo_advantages(torch.zeros(6))
    with pytest.raises(KeyError, match="known"):
        get_advantage("ppo")


def test_bf16_rewards_compute_in_float32():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0]])
    out = grpo_advantages(r.to(torch.bfloat16))
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, grpo_advantages(r))
    assert not out.requires_grad


def test_advantages_to_tokens_uses_mask_only():
    adv = torch.tensor([2.0, -1.0])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    torch.testing.assert_close(advantages_to_tokens(adv, mask), torch.tensor([[2.0, 2.0, 0.0], [-1.0, 0.0, 0.0]]))
    # (B, G) advantages flatten row-major: group 0's samples first
    torch.testing.assert_close(advantages_to_tokens(torch.tensor([[1.0, 2.0]]), torch.ones(2, 1)),
                               torch.tensor([[1.0], [2.0]]))
    with pytest.raises(ValueError):
        advantages_to_tokens(torch.zeros(3), mask)


def test_overlong_penalty_hand_example_and_loop():
    # max_len 10, cache 4: window starts at 6. L=6 -> 0; 7 -> (6-7)/4 = -0.25; 8 -> -0.5; 10 -> -1; 11 -> -1
    lengths = torch.tensor([0, 6, 7, 8, 10, 11])
    torch.testing.assert_close(overlong_penalty(lengths, 10, 4), torch.tensor([0, 0, -0.25, -0.5, -1.0, -1.0]))

    def naive(L, max_len, cache):
        if L <= max_len - cache:
            return 0.0
        if L <= max_len:
            return ((max_len - cache) - L) / cache
        return -1.0

    lengths = torch.arange(0, 40)
    expected = torch.tensor([naive(int(L), 32, 8) * 0.5 for L in lengths])
    torch.testing.assert_close(overlong_penalty(lengths, 32, 8, factor=0.5), expected)
    with pytest.raises(ValueError):
        overlong_penalty(lengths, 10, 0)


def test_lowprob_weights():
    old_logp = torch.log(torch.tensor([[1.0, 0.5, 0.1, 1e-9]]))
    # c = 0 is the identity, exactly
    assert torch.equal(lowprob_token_weights(old_logp, 0.0), torch.ones(1, 4))
    # c = 1: w = 2 - p -> [1, 1.5, 1.9, ~2]
    torch.testing.assert_close(lowprob_token_weights(old_logp, 1.0), torch.tensor([[1.0, 1.5, 1.9, 2.0]]))
    # naive loop over random log-probs, c = 0.3; and weights decrease with probability
    lp = -torch.rand(50, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 8
    w = lowprob_token_weights(lp[None], 0.3)[0]
    torch.testing.assert_close(w, torch.tensor([1 + 0.3 - 0.3 * math.exp(x) for x in lp.tolist()], dtype=torch.float64))
    order = torch.argsort(lp)
    assert torch.all(w[order][1:] <= w[order][:-1])
    # bf16 input, garbage in padding stays finite, no gradient
    garbage = torch.tensor([[-1.0, float("inf"), float("nan")]], dtype=torch.bfloat16, requires_grad=True)
    w = lowprob_token_weights(garbage, 0.5)
    assert w.dtype == torch.float32 and torch.isfinite(w).all() and not w.requires_grad
    with pytest.raises(ValueError):
        lowprob_token_weights(old_logp, -0.1)


def test_negative_advantage_weight():
    # Group [1, 0, 0, 1]: GRPO gives +-(0.5 / stdev) = +-0.866 (stdev of {1,0,0,1} = 0.5774).
    adv = grpo_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]))
    a = 0.5 / statistics.stdev([1, 0, 0, 1])
    torch.testing.assert_close(weight_negative_advantages(adv, 0.25), torch.tensor([[a, -0.25 * a, -0.25 * a, a]]),
                               atol=1e-5, rtol=1e-5)
    # weight 1 is the estimator unchanged, bit for bit; weight 0 keeps only the positive part (PSR)
    r = torch.randn(6, 8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(weight_negative_advantages(r, 1.0), r)
    torch.testing.assert_close(weight_negative_advantages(r, 0.0), r.clamp(min=0))
    # naive loop, random weight; dtype kept
    r64 = r.double()
    out = weight_negative_advantages(r64, 0.3)
    assert out.dtype == torch.float64
    assert out.flatten().tolist() == [x * 0.3 if x < 0 else x for x in r64.flatten().tolist()]
    with pytest.raises(ValueError):
        weight_negative_advantages(r, 1.5)
