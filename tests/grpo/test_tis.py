"""Truncated importance sampling (GRPOConfig.tis_cap) and the rollout-vs-trainer log-prob mismatch metrics.

TIS (losses.truncated_is_weights, grpo_loss's is_weights): the PPO ratio's old log-probs are the trainer's own
epoch-0 log-probs, and each token's policy term is multiplied by w = min(exp(trainer_logp - rollout_logp),
cap), no gradient. Pure-tensor tests check the weights and a hand-worked loss and gradient; trainer tests
(grpo_helpers.py's tiny model and parity verifier) run train_grpo with tis_cap set, with the HF engine as it
is (it agrees with the trainer to ~1e-7) and with an engine whose log-probs are planted 0.3 too high. Also
here: an unknown rollout-engine name fails before any work (rollout_engine.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from grpo_helpers import VERIFIER, tiny_cfg

from rlvr_core.experiment.config import GRPOConfig, RewardConfig
from rlvr_core.grpo import trainer as trainer_mod
from rlvr_core.grpo.losses import grpo_loss, mask_from_lengths, truncated_is_weights
from rlvr_core.sampling.hf import HFEngine

SHIFT = 0.3  # planted: the engine reports every sampled token's log-prob this much too high


# ------------------------------------------------------------------------------------------ pure tensors
def test_an_engine_that_agrees_gives_weights_one_and_the_plain_loss():
    g = torch.Generator().manual_seed(0)
    B, T = 6, 5
    logp = (-torch.rand(B, T, generator=g, dtype=torch.float64) * 3).requires_grad_()
    mask = mask_from_lengths(torch.tensor([5, 1, 3, 5, 2, 4]), T)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    ref = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    old = logp.detach().clone()  # the trainer's own epoch-0 log-probs
    w, m = truncated_is_weights(old, old.clone(), mask, cap=2.0)  # engine == trainer
    assert torch.equal(w, torch.ones_like(w)) and not w.requires_grad
    assert float(m["tis/weight_mean"]) == 1.0 and float(m["tis/clipped_share"]) == 0.0
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        kw = dict(ref_logp=ref, beta=0.05, agg_mode=agg, norm_len=T, lowprob_c=0.5)
        plain, pm = grpo_loss(logp, old, adv, mask, **kw)
        weighted, wm = grpo_loss(logp, old, adv, mask, is_weights=w, **kw)
        assert torch.equal(plain, weighted), agg
        assert all(torch.equal(pm[k], wm[k]) for k in pm), agg
        (g_plain,) = torch.autograd.grad(plain, logp)
        (g_weighted,) = torch.autograd.grad(weighted, logp)
        assert torch.equal(g_plain, g_weighted), agg


def test_hand_worked_weighted_loss_and_gradient():
    # One sequence, advantage 2, four positions, the last one padding (garbage there must not matter).
    trainer_old = torch.tensor([[-1.0, -2.0, -0.5, 0.0]], dtype=torch.float64)
    rollout = torch.tensor([[-1.5, -1.0, -3.0, math.inf]], dtype=torch.float64)
    mask = mask_from_lengths(torch.tensor([3]), 4)
    cap = 2.0
    w, m = truncated_is_weights(trainer_old, rollout, mask, cap)
    want_w = [math.exp(0.5), math.exp(-1.0), cap]  # exp(2.5) = 12.2 is capped
    torch.testing.assert_close(w[0, :3], torch.tensor(want_w, dtype=torch.float64), rtol=0, atol=1e-15)
    assert float(m["tis/weight_mean"]) == pytest.approx(sum(want_w) / 3, rel=1e-6)
    assert float(m["tis/clipped_share"]) == pytest.approx(1 / 3)

    # Second epoch: the policy moved. Token 0's ratio is e^0.1 (inside the clip range), token 1's e^0.2,
    # token 2's e^0.3 = 1.35 > 1 + 0.28 with A > 0: clipped, so its gradient is 0 whatever its weight.
    delta = torch.tensor([[0.1, 0.2, 0.3, 7.0]], dtype=torch.float64)
    logp = (trainer_old + delta).requires_grad_()
    A = 2.0
    loss, metrics = grpo_loss(logp, trainer_old, torch.tensor([A], dtype=torch.float64), mask, is_weights=w,
                              clip_low=0.2, clip_high=0.28, agg_mode="token-mean")
    r = [math.exp(0.1), math.exp(0.2), math.exp(0.3)]
    per_token = [-A * r[0] * want_w[0], -A * r[1] * want_w[1], -A * 1.28 * want_w[2]]
    assert float(loss.detach()) == pytest.approx(sum(per_token) / 3, rel=1e-12)
    (grad,) = torch.autograd.grad(loss, logp)
    want_grad = [-A * r[0] * want_w[0] / 3, -A * r[1] * want_w[1] / 3, 0.0, 0.0]
    torch.testing.assert_close(grad[0], torch.tensor(want_grad, dtype=torch.float64), rtol=1e-12, atol=1e-15)
    # The ratio metrics are the PPO ratio's, unweighted.
    assert float(metrics["ratio_max"]) == pytest.approx(r[2], rel=1e-6)
    assert float(metrics["clip_frac_high"]) == pytest.approx(1 / 3)


def test_the_kl_term_is_not_weighted_and_bad_caps_fail():
    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0]], dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    w = torch.full((1, 2), 0.5, dtype=torch.float64)
    kw = dict(ref_logp=ref, beta=0.1)
    plain, pm = grpo_loss(logp, logp.detach(), torch.tensor([1.0], dtype=torch.float64), mask, **kw)
    weighted, wm = grpo_loss(logp, logp.detach(), torch.tensor([1.0], dtype=torch.float64), mask, is_weights=w, **kw)
    torch.testing.assert_close(wm["pg_loss"], pm["pg_loss"] * 0.5)
    torch.testing.assert_close(wm["kl_loss"], pm["kl_loss"])
    torch.testing.assert_close(weighted, plain - 0.5 * pm["pg_loss"].double(), rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="cap must be > 0"):
        truncated_is_weights(logp, ref, mask, 0.0)
    with pytest.raises(ValueError, match="tensor shape"):
        grpo_loss(logp, logp.detach(), torch.tensor([1.0]), mask, is_weights=torch.ones(1, 3))
    with pytest.raises(ValueError):
        GRPOConfig(tis_cap=0)
    assert GRPOConfig().tis_cap is None


# ------------------------------------------------------------------------------------------- the trainer
@contextlib.contextmanager
def _planted_engine(from_step: int):
    """The HF engine, but every sampled token's reported log-prob is SHIFT too high from step `from_step` on
    (the tokens themselves are unchanged): an engine that disagrees with the trainer."""
    real = HFEngine.generate

    def generate(self, prompts, prompt_ids, params, **kw):
        out = real(self, prompts, prompt_ids, params, **kw)
        if kw["step"] < from_step:
            return out
        return [[dataclasses.replace(s, logprobs=[lp + SHIFT for lp in s.logprobs]) for s in g] for g in out]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(HFEngine, "generate", generate)
        yield


@contextlib.contextmanager
def _recording_losses():
    calls = []
    real = trainer_mod.grpo_loss

    def rec(logp, old_logp, adv, mask, **kw):
        calls.append(dict(logp=logp.detach().clone(), old=old_logp.detach().clone(), mask=mask.clone(),
                          w=kw.get("is_weights")))
        return real(logp, old_logp, adv, mask, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trainer_mod, "grpo_loss", rec)
        yield calls


def _run(tiny, out: Path, cfg: GRPOConfig):
    model_dir, rows, ids = tiny
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the machine's 2 cores are shared; more threads only slow it down
    try:
        res = trainer_mod.train_grpo(model_dir, rows, ids, out, cfg, template_id="qa", reward=RewardConfig(verifier=VERIFIER),
                                      max_new_tokens=12, seed=0)
    finally:
        torch.set_num_threads(threads)
    return pq.read_table(res.steps_path).to_pylist()


def test_train_grpo_with_tis_on_an_agreeing_engine(tiny, tmp_path):
    with _recording_losses() as calls:
        rows = _run(tiny, tmp_path / "tis", tiny_cfg(steps=2, epochs_per_step=2, tis_cap=2.0))
    plain = _run(tiny, tmp_path / "plain", tiny_cfg(steps=2, epochs_per_step=2))
    assert len(calls) == 4  # 2 steps x 2 epochs
    for ep0, ep1 in (calls[0:2], calls[2:4]):
        # old log-probs = the trainer's own epoch-0 ones, kept for the second epoch; the weights too
        assert torch.equal(ep0["old"], ep0["logp"]) and torch.equal(ep1["old"], ep0["old"])
        assert ep0["w"] is not None and torch.equal(ep1["w"], ep0["w"])
        m = ep0["mask"]
        assert float((ep0["w"][m] - 1).abs().max()) < 1e-4  # HF engine and trainer agree to ~1e-7
    for r, p in zip(rows, plain):
        assert r["ratio_mean"] == 1.0 and r["ratio_max"] == 1.0 and r["clip_frac"] == 0.0  # exactly on-policy
        assert r["tis/weight_mean"] == pytest.approx(1.0, abs=1e-4) and r["tis/clipped_share"] == 0.0
        assert r["logprob_mismatch/mean_abs"] == r["logprob_abs_diff"] < 1e-4
        assert r["logprob_mismatch/max_abs"] < 1e-4 and r["logprob_mismatch/share_over_tol"] == 0.0
        assert r["health/G-onpolicy-ratio"] == 0
        assert "tis/weight_mean" not in p
    # Step 1 sampled the same completions, and with w ~ 1 the loss is the plain one.
    assert rows[0]["reward_mean"] == plain[0]["reward_mean"] and rows[0]["n_tokens"] == plain[0]["n_tokens"]
    assert rows[0]["loss"] == pytest.approx(plain[0]["loss"], rel=1e-4, abs=1e-6)


def test_train_grpo_with_tis_reweights_a_disagreeing_engine(tiny, tmp_path):
    # Every reported log-prob SHIFT too high (tolerance raised so step 1's G-logprob-temp lets it through):
    # w = exp(trainer - rollout) = exp(-SHIFT) on every token; the same rollouts without the plant give the
    # reference loss, so the policy loss is exp(-SHIFT) times it.
    cfg = dict(steps=1, guards={"logprob_guard_tol": 1.0})
    with _planted_engine(from_step=0):
        (r,) = _run(tiny, tmp_path / "tis", tiny_cfg(tis_cap=2.0, **cfg))
        (capped,) = _run(tiny, tmp_path / "capped", tiny_cfg(tis_cap=0.5, **cfg))
    (ref,) = _run(tiny, tmp_path / "ref", tiny_cfg(tis_cap=2.0, **cfg))
    assert r["tis/weight_mean"] == pytest.approx(math.exp(-SHIFT), abs=1e-4) and r["tis/clipped_share"] == 0.0
    assert r["pg_loss"] == pytest.approx(math.exp(-SHIFT) * ref["pg_loss"], rel=1e-4, abs=1e-7)
    assert capped["tis/weight_mean"] == pytest.approx(0.5, abs=1e-7) and capped["tis/clipped_share"] == 1.0
    assert capped["pg_loss"] == pytest.approx(0.5 * ref["pg_loss"], rel=1e-4, abs=1e-7)
    assert r["ratio_mean"] == 1.0  # TIS: the ratio is against the trainer's own log-probs
    assert r["logprob_mismatch/mean_abs"] == pytest.approx(SHIFT, abs=1e-4)
    assert r["logprob_mismatch/max_abs"] == pytest.approx(SHIFT, abs=1e-4)


def test_mismatch_after_step_one_is_measured_and_flagged(tiny, tmp_path):
    # From step 2 on the engine disagrees (as one that missed a weight sync would): the mismatch columns
    # show it, and G-onpolicy-ratio flags the on-policy step even though the ratio (TIS: trainer's own
    # old log-probs) is exactly 1.
    for name, extra in (("plain", {}), ("tis", {"tis_cap": 2.0})):
        with _planted_engine(from_step=1):
            rows = _run(tiny, tmp_path / name, tiny_cfg(steps=2, **extra))
        one, two = rows
        assert one["health/G-onpolicy-ratio"] == 0 and one["logprob_mismatch/share_over_tol"] == 0.0
        assert two["health/G-onpolicy-ratio"] == 1, name
        assert two["logprob_mismatch/mean_abs"] == pytest.approx(SHIFT, abs=1e-4)
        assert two["logprob_mismatch/max_abs"] == pytest.approx(SHIFT, abs=1e-4)
        assert two["logprob_mismatch/share_over_tol"] == 1.0
        if extra:
            assert two["ratio_mean"] == 1.0 and two["tis/weight_mean"] == pytest.approx(math.exp(-SHIFT), abs=1e-4)


def test_an_unknown_rollout_engine_fails_before_any_work(tiny, tmp_path):
    model_dir, rows, ids = tiny
    with pytest.raises(ValueError, match=r"unknown rollout engine 'nope': known engines are \['hf'"):
        trainer_mod.train_grpo(model_dir, rows, ids, tmp_path / "x", tiny_cfg(), template_id="qa", reward=RewardConfig(verifier=VERIFIER),
                                max_new_tokens=12, seed=0, engine="nope")
    assert not (tmp_path / "x").exists()


def test_a_correction_that_rejects_most_tokens_is_flagged(tiny, tmp_path):
    # G-correction-mask, planted: the engine reports every log-prob SHIFT too high, so every token's ratio is
    # exp(-SHIFT) ~ 0.74. A mask mode with C_min 0.8 rejects them all (the step trains on nothing: loss 0) and is
    # flagged; C_min 0.5 keeps them all (weight exp(-SHIFT)) and is not. Both modes, one step each.
    cfg = dict(steps=1, tis_cap=2.0, guards={"logprob_guard_tol": 1.0})
    with _planted_engine(from_step=0):
        (tok,) = _run(tiny, tmp_path / "tok", tiny_cfg(tis_mode="token_mask", tis_min=0.8, **cfg))
        (seq,) = _run(tiny, tmp_path / "seq", tiny_cfg(tis_mode="sequence_mask", tis_min=0.8, **cfg))
        (kept,) = _run(tiny, tmp_path / "kept", tiny_cfg(tis_mode="sequence_mask", tis_min=0.5, **cfg))
    for r in (tok, seq):
        assert r["tis/masked_share"] == 1.0 and r["tis/seq_all_masked_share"] == 1.0
        assert r["health/G-correction-mask"] == 1 and r["pg_loss"] == 0.0
        assert r["mismatch/log_ratio_mean"] == pytest.approx(-SHIFT, abs=1e-4)
        assert r["mismatch/kl"] == pytest.approx(math.exp(-SHIFT) - 1 + SHIFT, abs=1e-4)
    assert seq["tis/seq_masked_share"] == 1.0
    assert kept["health/G-correction-mask"] == 0 and kept["tis/masked_share"] == 0.0
    assert kept["tis/weight_mean"] == pytest.approx(math.exp(-SHIFT), abs=1e-4) and kept["pg_loss"] != 0.0


@pytest.mark.parametrize("loss", ["gspo", "luspo", "cispo", "sapo"])
def test_each_policy_loss_trains_at_its_defaults(tiny, tmp_path, loss):
    # The new losses (policy_losses.py) through the real trainer at their default parameters, with a rollout
    # correction mode each: finite losses, a real update (the weights move), exactly on-policy epoch 0, and no
    # guard flag or stop (G-onpolicy-ratio reads their ratio and clip metrics).
    extra = {"loss_agg": "seq-mean-token-sum"} if loss == "luspo" else {}
    mode = {"gspo": "sequence_mask", "luspo": "sequence_truncate", "cispo": "token_mask", "sapo": "token_truncate"}
    rows = _run(tiny, tmp_path / loss, tiny_cfg(steps=3, policy_loss=loss, tis_cap=2.0, tis_min=0.5,
                                                tis_mode=mode[loss], **extra))
    assert len(rows) == 3
    for r in rows:
        assert math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0, r
        assert r["ratio_mean"] == pytest.approx(1.0, abs=1e-6) and r["clip_frac"] == 0.0
        assert r["tis/masked_share"] == 0.0 and r["tis/clipped_share"] == 0.0
        assert not any(v for k, v in r.items() if k.startswith("health/")), r
