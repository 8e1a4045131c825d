"""PPO-clip (clip-higher) loss, aggregation modes and the composed GRPO objective.

References: a per-element Python loop written from the PPO/DAPO formulas, a hand-worked example, and the
on-policy closed form (logp == old_logp: ratio 1, no clipping, d loss / d logp = -A * mask / normaliser).
"""

from __future__ import annotations

import math

import pytest
import torch

from rlvr_core.grpo import (aggregate_loss, get_policy_loss, grpo_loss, kl_k3, known_loss_aggs, lowprob_token_weights,
                            mask_from_lengths, ppo_clip_loss)

EL, EH = 0.2, 0.28
MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
NORM_LEN = 8


def _batch(seed=0, B=5, T=7, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([7, 3, 1, 5, 6][:B])
    mask = mask_from_lengths(lengths, T)
    logp = -torch.rand(B, T, generator=gen, dtype=dtype) * 5
    # ratios spread well beyond both clip bounds
    old = logp + torch.randn(B, T, generator=gen, dtype=dtype) * 0.4
    # alternating signs, so every seed exercises both clip bounds
    adv = torch.randn(B, generator=gen, dtype=dtype).abs() * torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0][:B], dtype=dtype)
    return logp, old, adv, mask


def _naive(logp, old, adv, mask, mode, norm_len=NORM_LEN):
    B, T = mask.shape
    per_seq_sum, per_seq_n, total, n_tok, low, high, ratios = [], [], 0.0, 0, 0, 0, []
    for b in range(B):
        s, n = 0.0, 0
        for t in range(T):
            if not mask[b, t]:
                continue
            a = float(adv[b]) if adv.dim() == 1 else float(adv[b, t])
            r = math.exp(float(logp[b, t]) - float(old[b, t]))
            ratios.append(r)
            loss = -min(r * a, min(max(r, 1 - EL), 1 + EH) * a)
            s += loss
            n += 1
            low += a < 0 and r < 1 - EL
            high += a > 0 and r > 1 + EH
        per_seq_sum.append(s)
        per_seq_n.append(n)
        total += s
        n_tok += n
    if mode == "token-mean":
        value = total / n_tok
    elif mode == "seq-mean-token-mean":
        value = sum(s / max(n, 1) for s, n in zip(per_seq_sum, per_seq_n)) / B
    else:
        value = total / (B * norm_len)
    return value, low / n_tok, high / n_tok, ratios


@pytest.mark.parametrize("mode", MODES)
def test_ppo_clip_matches_naive_loop(mode):
    logp, old, adv, mask = _batch()
    loss, m = ppo_clip_loss(logp, old, adv, mask, clip_low=EL, clip_high=EH, agg_mode=mode, norm_len=NORM_LEN)
    value, low, high, ratios = _naive(logp, old, adv, mask, mode)
    assert loss.item() == pytest.approx(value, rel=1e-6)
    assert m["clip_frac_low"].item() == pytest.approx(low) and m["clip_frac_high"].item() == pytest.approx(high)
    assert low > 0 and high > 0  # the data really exercises both bounds
    assert m["clip_frac"].item() == pytest.approx(low + high)
    assert m["ratio_max"].item() == pytest.approx(max(ratios), rel=1e-6)
    assert m["ratio_min"].item() == pytest.approx(min(ratios), rel=1e-6)
    assert m["ratio_mean"].item() == pytest.approx(sum(ratios) / len(ratios), rel=1e-6)
    assert m["approx_kl_old_new"].item() == pytest.approx(sum(r - 1 - math.log(r) for r in ratios) / len(ratios),
                                                          rel=1e-5)
    assert get_policy_loss("ppo_clip") is ppo_clip_loss


def test_clip_higher_hand_example():
    # token 0: A=+1, r=1.5 -> min(1.5, 1.28) = 1.28 -> loss -1.28 (clipped high, no gradient)
    # token 1: A=-1, r=0.5 -> min(-0.5, -0.8) = -0.8 -> loss +0.8 (clipped low, no gradient)
    # token 2: A=+1, r=0.5 -> min(0.5, 0.8) = 0.5 -> loss -0.5 (ratio outside, but moving the right way: kept)
    # token-mean = (-1.28 + 0.8 - 0.5) / 3 = -0.98 / 3
    old = torch.zeros(1, 3)
    logp = torch.log(torch.tensor([[1.5, 0.5, 0.5]])).requires_grad_()
    adv = torch.tensor([[1.0, -1.0, 1.0]])
    loss, m = ppo_clip_loss(logp, old, adv, torch.ones(1, 3, dtype=torch.bool), clip_low=0.2, clip_high=0.28)
    assert loss.item() == pytest.approx(-0.98 / 3, rel=1e-6)
    assert m["clip_frac_high"].item() == pytest.approx(1 / 3) and m["clip_frac_low"].item() == pytest.approx(1 / 3)
    loss.backward()
    # d/dlogp of -r*A/3 with r = 0.5, A = 1 is -0.5/3 for token 2; clipped tokens get 0
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 0.0, -0.5 / 3]]))


@pytest.mark.parametrize("mode", MODES)
def test_on_policy_closed_form(mode):
    logp, _, adv, mask = _batch(seed=1, dtype=torch.float32)
    logp.requires_grad_()
    loss, m = ppo_clip_loss(logp, logp.detach().clone(), adv, mask, agg_mode=mode, norm_len=NORM_LEN)
    assert m["ratio_mean"].item() == 1.0 and m["ratio_max"].item() == 1.0 and m["ratio_min"].item() == 1.0
    assert m["clip_frac"].item() == 0.0 and m["approx_kl_old_new"].item() == 0.0
    loss.backward()
    B = mask.shape[0]
    if mode == "token-mean":
        norm = mask.sum().float()
    elif mode == "seq-mean-token-mean":
        norm = mask.sum(-1, keepdim=True).float() * B
    else:
        norm = torch.tensor(float(B * NORM_LEN))
    expected = -adv[:, None] * mask / norm
    torch.testing.assert_close(logp.grad, expected)
    # and the loss value is -sum(A)/norm, since the ratio is 1
    torch.testing.assert_close(loss.detach(), (-adv[:, None] * mask / norm).sum())


def test_padding_values_cannot_change_loss_or_gradient():
    # G-pad-mask: padding may hold log-prob 0 (pad id 0 scored as a token), huge values, inf or nan.
    logp, old, adv, mask = _batch(seed=2, dtype=torch.float32)
    ref = logp + 0.3
    clean = [x.clone() for x in (logp, old, ref)]
    dirty = [x.clone() for x in (logp, old, ref)]
    junk = torch.tensor([0.0, 1e4, float("inf"), float("nan"), -float("inf")])
    pad = ~mask
    for x in dirty:
        x[pad] = junk.repeat(int(pad.sum()) // 5 + 1)[: int(pad.sum())]
    results = []
    for lp, ol, rf in (clean, dirty):
        lp = lp.requires_grad_()
        loss, m = grpo_loss(lp, ol, adv, mask, ref_logp=rf, beta=0.1, agg_mode="seq-mean-token-mean")
        loss.backward()
        results.append((loss.detach(), m, lp.grad))
    (l1, m1, g1), (l2, m2, g2) = results
    assert torch.isfinite(l2) and torch.equal(l1, l2)
    assert torch.isfinite(g2).all() and torch.equal(g1, g2) and torch.equal(g2[pad], torch.zeros(int(pad.sum())))
    for k in m1:
        torch.testing.assert_close(m1[k], m2[k], equal_nan=True)


@pytest.mark.parametrize("mode", MODES)
def test_micro_batches_with_global_normaliser_add_up(mode):
    logp, old, adv, mask = _batch(seed=3)
    full, _ = ppo_clip_loss(logp, old, adv, mask, agg_mode=mode, norm_len=NORM_LEN)
    n_tok, n_seq = mask.sum(), mask.shape[0]
    parts = [ppo_clip_loss(logp[s], old[s], adv[s], mask[s], agg_mode=mode, norm_len=NORM_LEN,
                           num_tokens=n_tok, num_seqs=n_seq)[0] for s in (slice(0, 2), slice(2, 5))]
    torch.testing.assert_close(parts[0] + parts[1], full)


def test_gradcheck_float64():
    # offsets keep every ratio away from the clip kinks (log 0.8 = -0.22, log 1.28 = 0.25)
    B, T = 3, 4
    base = -torch.rand(B, T, generator=torch.Generator().manual_seed(4), dtype=torch.float64) * 3
    offsets = torch.tensor([-0.5, -0.1, 0.05, 0.4], dtype=torch.float64).repeat(B, 1)
    old = base + offsets
    adv = torch.tensor([1.0, -0.7, 0.3], dtype=torch.float64)
    mask = mask_from_lengths(torch.tensor([4, 2, 3]), T)
    ref = base - 0.2
    for mode in MODES:
        def f(lp):
            return grpo_loss(lp, old, adv, mask, ref_logp=ref, beta=0.05, agg_mode=mode, norm_len=6)[0]
        assert torch.autograd.gradcheck(f, (base.clone().requires_grad_(),))


def test_bf16_inputs_compute_in_float32():
    logp, old, adv, mask = _batch(seed=5, dtype=torch.float32)
    lp16, old16 = logp.to(torch.bfloat16).requires_grad_(), old.to(torch.bfloat16)
    loss16, m16 = ppo_clip_loss(lp16, old16, adv.to(torch.bfloat16), mask)
    # reference: the same (rounded) values in float32
    lp32 = lp16.detach().float().requires_grad_()
    loss32, m32 = ppo_clip_loss(lp32, old16.float(), adv.to(torch.bfloat16).float(), mask)
    assert loss16.dtype == torch.float32 and all(v.dtype == torch.float32 for v in m16.values())
    torch.testing.assert_close(loss16, loss32)
    for k in m16:
        torch.testing.assert_close(m16[k], m32[k])
    loss16.backward()
    loss32.backward()
    assert lp16.grad.dtype == torch.bfloat16
    torch.testing.assert_close(lp16.grad.float(), lp32.grad, rtol=1e-2, atol=1e-4)


def test_on_policy_bf16_ratio_is_exactly_one():
    # the same bf16 values on both sides must give ratio 1 (no spurious clipping from rounding)
    lp = (-torch.rand(4, 6) * 5).to(torch.bfloat16)
    _, m = ppo_clip_loss(lp, lp.clone(), torch.ones(4), torch.ones(4, 6, dtype=torch.bool))
    assert m["ratio_max"].item() == 1.0 and m["clip_frac"].item() == 0.0


def test_aggregation_hand_example():
    # L = [[1, 2, 3], [4, pad, pad]]: token-mean 10/4 = 2.5; seq-mean-token-mean (2 + 4)/2 = 3;
    # sum-norm with norm_len 5: 10 / (2 * 5) = 1
    L = torch.tensor([[1.0, 2.0, 3.0], [4.0, 99.0, float("nan")]])
    mask = mask_from_lengths(torch.tensor([3, 1]), 3)
    assert aggregate_loss(L, mask, "token-mean").item() == 2.5
    assert aggregate_loss(L, mask, "seq-mean-token-mean").item() == 3.0
    assert aggregate_loss(L, mask, "seq-mean-token-sum-norm", norm_len=5).item() == 1.0
    assert aggregate_loss(L, mask, "seq-mean-token-sum").item() == 5.0  # (6 + 4) / 2
    # a sequence with no response token is not a sequence of the denominator (verl #3915)
    L3, mask3 = torch.cat([L, torch.ones(1, 3)]), torch.cat([mask, torch.zeros(1, 3, dtype=torch.bool)])
    for mode in ("seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "token-mean"):
        assert aggregate_loss(L3, mask3, mode, norm_len=5) == aggregate_loss(L, mask, mode, norm_len=5), mode
    with pytest.raises(ValueError, match="norm_len"):
        aggregate_loss(L, mask, "seq-mean-token-sum-norm")
    with pytest.raises(KeyError, match="known"):
        aggregate_loss(L, mask, "seq-mean")
    assert set(known_loss_aggs()) == {*MODES, "seq-mean-token-sum"}  # its own hand example above


def test_empty_mask_gives_zero_loss_and_nan_metrics():
    z = torch.zeros(2, 3)
    loss, m = ppo_clip_loss(z, z, torch.ones(2), torch.zeros(2, 3, dtype=torch.bool))
    assert loss.item() == 0.0
    assert math.isnan(m["ratio_mean"].item()) and math.isnan(m["ratio_max"].item())


def test_grpo_loss_composition():
    logp, old, adv, mask = _batch(seed=6)
    ref = logp.detach() + torch.randn(logp.shape, generator=torch.Generator().manual_seed(7), dtype=logp.dtype) * 0.2
    pg, _ = ppo_clip_loss(logp, old, adv, mask, agg_mode="token-mean")
    # beta = 0: no reference needed, loss is the policy loss
    loss0, m0 = grpo_loss(logp, old, adv, mask)
    torch.testing.assert_close(loss0, pg)
    assert "kl_ref_mean" not in m0
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_loss(logp, old, adv, mask, beta=0.1)
    # beta > 0: + beta * token-mean of k3 (naive loop)
    ks = [math.exp(float(ref[b, t] - logp[b, t])) - float(ref[b, t] - logp[b, t]) - 1
          for b in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[b, t]]
    loss, m = grpo_loss(logp, old, adv, mask, ref_logp=ref, beta=0.04)
    assert loss.item() == pytest.approx(pg.item() + 0.04 * sum(ks) / len(ks), rel=1e-9)
    # metrics are reported in float32
    assert m["kl_ref_max"].item() == pytest.approx(max(ks), rel=1e-6)
    assert m["kl_ref_mean"].item() == pytest.approx(sum(ks) / len(ks), rel=1e-6)
    # lowprob reweighting = ppo_clip on advantages scaled by 1 + c - c * exp(old_logp)
    c = 0.5
    w = lowprob_token_weights(old, c)
    expected, _ = ppo_clip_loss(logp, old, adv[:, None] * w * mask, mask)
    got, _ = grpo_loss(logp, old, adv, mask, lowprob_c=c)
    torch.testing.assert_close(got, expected)
    # beta = 0 with a reference still reports KL (for the spike detector) but does not add it
    l_metric_only, m2 = grpo_loss(logp, old, adv, mask, ref_logp=ref, beta=0.0)
    torch.testing.assert_close(l_metric_only, pg)
    assert m2["kl_ref_mean"].item() == pytest.approx(sum(ks) / len(ks), rel=1e-6)
    assert float(kl_k3(logp, ref)[mask].max()) == pytest.approx(max(ks), rel=1e-9)


def test_mask_from_lengths():
    m = mask_from_lengths(torch.tensor([0, 2, 3]), 3)
    assert m.tolist() == [[False, False, False], [True, True, False], [True, True, True]]
    # G-pad-mask: a completion containing the pad id (0, "!" in Qwen3) mid-sequence keeps every real token,
    # because the mask never looks at token values
    ids = torch.tensor([[17, 0, 0, 42, 0, 0]])  # 4 real tokens, then padding with pad id 0
    assert mask_from_lengths(torch.tensor([4]), ids.shape[1]).tolist() == [[True] * 4 + [False] * 2]
    with pytest.raises(ValueError):
        mask_from_lengths(torch.tensor([4]), 3)
