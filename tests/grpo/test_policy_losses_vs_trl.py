"""The new policy losses (policy_losses.py) and the rollout-correction weights in the loss, against TRL's own code.

The reference is TRL 1.16's `GRPOTrainer._compute_loss` (trl/trainer/grpo_trainer.py), called unbound on a
stand-in `self` (`_TrlSelf`) that holds the trainer attributes the method reads and whose
`_get_per_token_logps_and_entropies` returns the given log-prob tensor instead of running a model. So TRL's
code, not a transcription, computes the loss from exactly the log-probs, old log-probs, advantages, masks
and importance weights handed to ours, and `torch.autograd.grad` w.r.t. that one log-prob tensor compares
the gradients. (tests/grpo/test_losses_vs_trl.py drives the whole trainer with a model for ppo_clip; here the
same tensors must go to both sides, including fully masked rows and 10,000-token sequences a model run
could not afford on CPU.) Equality: loss and gradient to 1e-6 absolute (float64 inputs).

Option mapping (TRL -> ours):
    loss_type="grpo", importance_sampling_level="sequence"  -> policy_loss gspo, agg seq-mean-token-mean
    loss_type="luspo", importance_sampling_level="sequence" -> policy_loss luspo, agg seq-mean-token-sum
    loss_type="cispo", epsilon_high=C                       -> policy_loss cispo, clip_max=C, agg token-mean,
                                                               num_tokens = TRL's num_items_in_batch
    loss_type="sapo", sapo_temperature_pos/neg              -> policy_loss sapo, tau_pos/neg, seq-mean-token-mean
    use_vllm + vllm_importance_sampling_correction, inputs["importance_sampling_ratio"] = w
                                                            -> grpo_loss(is_weights=w)

Known design difference, pinned below: a sequence with no response token (empty completion, or every token
rejected by a correction mask mode) is not counted in our sequence denominators (verl #3915); TRL counts it.
Ours equals TRL on the rows that hold tokens.
"""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

trl = pytest.importorskip("trl", reason="TRL is not installed: the cross-check against TRL's loss needs it")
from trl import GRPOTrainer  # noqa: E402

from rlvr_core.grpo.losses import grpo_loss, mask_from_lengths  # noqa: E402
from rlvr_core.grpo.rollout_correction import correction_weights  # noqa: E402

MAX_LEN = 12


class _Accel:
    num_processes = 1

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x


class _TrlSelf:
    """What `GRPOTrainer._compute_loss` reads from `self`, with log-probs given instead of a model forward."""

    def __init__(self, logp, *, loss_type, level="token", eps_low=0.2, eps_high=0.28, tau_pos=1.0, tau_neg=1.05,
                 is_ratio=False):
        self._logp = logp
        self.loss_type, self.importance_sampling_level = loss_type, level
        self.epsilon_low, self.epsilon_high = eps_low, eps_high
        self.beta, self.top_entropy_quantile, self.off_policy_mask_threshold = 0.0, 1.0, None
        self.use_vllm = self.vllm_importance_sampling_correction = is_ratio
        self.aux_loss_enabled = self._entropy_bonus_enabled = False
        self.current_gradient_accumulation_steps, self.max_completion_length = 1, MAX_LEN
        self.model = SimpleNamespace(training=True)
        self.accelerator = _Accel()
        self._metrics = defaultdict(lambda: defaultdict(list))
        self.args = SimpleNamespace(use_bias_correction_kl=False, delta=None, sapo_temperature_pos=tau_pos,
                                    sapo_temperature_neg=tau_neg, steps_per_generation=1)

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, **kw):
        return self._logp, torch.zeros_like(self._logp.detach()), None


def trl_loss(logp, old, adv, mask, *, is_ratio=None, **opts) -> torch.Tensor:
    """TRL's `_compute_loss` on these tensors (B, T); the prompt is one dummy token."""
    me = _TrlSelf(logp, is_ratio=is_ratio is not None, **opts)
    B = mask.shape[0]
    inputs = {"prompt_ids": torch.zeros(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1, dtype=torch.long),
              "completion_ids": torch.zeros(mask.shape, dtype=torch.long), "completion_mask": mask.long(),
              "advantages": adv, "old_per_token_logps": old, "num_items_in_batch": mask.sum()}
    if is_ratio is not None:
        inputs["importance_sampling_ratio"] = is_ratio
    return GRPOTrainer._compute_loss(me, None, inputs)


LOSSES = {  # ours: (policy_loss, loss_params, agg_mode); TRL: options
    "gspo": (dict(policy_loss="gspo", loss_params=dict(clip_low=3e-4, clip_high=4e-4), agg_mode="seq-mean-token-mean"),
             dict(loss_type="grpo", level="sequence", eps_low=3e-4, eps_high=4e-4)),
    "gspo-wide": (dict(policy_loss="gspo", loss_params=dict(clip_low=0.05, clip_high=0.08),
                       agg_mode="seq-mean-token-mean"),
                  dict(loss_type="grpo", level="sequence", eps_low=0.05, eps_high=0.08)),
    "luspo": (dict(policy_loss="luspo", loss_params=dict(clip_low=3e-4, clip_high=4e-4), agg_mode="seq-mean-token-sum"),
              dict(loss_type="luspo", level="sequence", eps_low=3e-4, eps_high=4e-4)),
    "cispo": (dict(policy_loss="cispo", loss_params=dict(clip_max=1.1), agg_mode="token-mean"),
              dict(loss_type="cispo", eps_high=1.1)),
    "sapo": (dict(policy_loss="sapo", loss_params=dict(tau_pos=1.0, tau_neg=1.05), agg_mode="seq-mean-token-mean"),
             dict(loss_type="sapo", tau_pos=1.0, tau_neg=1.05)),
}


def _batch(lengths, seed=0, T=MAX_LEN, spread=0.3):
    g = torch.Generator().manual_seed(seed)
    B = len(lengths)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    logp = (old + torch.randn(B, T, generator=g, dtype=torch.float64) * spread).requires_grad_()
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    return logp, old, adv, mask_from_lengths(torch.tensor(lengths), T)


def _both(name, logp, old, adv, mask, is_weights=None, trl_mask=None):
    ours_opts, trl_opts = LOSSES[name]
    ours, m = grpo_loss(logp, old, adv, mask, is_weights=is_weights, **ours_opts)
    theirs = trl_loss(logp, old, adv, mask if trl_mask is None else trl_mask, is_ratio=is_weights, **trl_opts)
    (g_ours,) = torch.autograd.grad(ours, logp)
    (g_theirs,) = torch.autograd.grad(theirs, logp)
    return ours, theirs, g_ours, g_theirs, m


def _assert_equal(ours, theirs, g_ours, g_theirs):
    assert g_theirs.abs().max() > 1e-3  # a real gradient, not two zeros
    torch.testing.assert_close(ours, theirs.to(ours.dtype), rtol=0, atol=1e-6)
    torch.testing.assert_close(g_ours, g_theirs, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", list(LOSSES))
def test_loss_and_gradient_equal_trl(name):
    logp, old, adv, mask = _batch([12, 3, 1, 7, 5, 12, 2, 9])
    ours, theirs, g_ours, g_theirs, m = _both(name, logp, old, adv, mask)
    _assert_equal(ours, theirs, g_ours, g_theirs)
    if name in ("gspo", "luspo"):  # the regime claimed: sequence ratios clipped on both sides at 3e-4 / 4e-4
        assert m["clip_frac_low"] > 0 and m["clip_frac_high"] > 0, m
    if name == "cispo":  # ... and CISPO's weight truncated on some tokens
        assert m["clip_frac_high"] > 0, m


@pytest.mark.parametrize("name", list(LOSSES))
def test_fully_masked_rows_and_an_empty_group_leave_the_denominator(name):
    """Rows 2, 5 and the whole last group (rows 6-7) hold no response token. Ours equals TRL on the rows that
    hold tokens (their gradient is exactly 0); TRL on the whole batch counts the empty rows in its sequence
    modes (verl #3915), which is the pinned difference."""
    logp, old, adv, mask = _batch([12, 3, 0, 7, 5, 0, 0, 0], seed=3)
    keep = mask.any(dim=-1)
    ours, _ = grpo_loss(logp, old, adv, mask, **LOSSES[name][0])
    (g_ours,) = torch.autograd.grad(ours, logp)
    sub = logp.detach()[keep].clone().requires_grad_()
    theirs = trl_loss(sub, old[keep], adv[keep], mask[keep], **LOSSES[name][1])
    (g_sub,) = torch.autograd.grad(theirs, sub)
    g_theirs = torch.zeros_like(g_ours)
    g_theirs[keep] = g_sub
    _assert_equal(ours, theirs, g_ours, g_theirs)
    assert torch.equal(g_ours[~keep], torch.zeros_like(g_ours[~keep]))
    full = trl_loss(logp, old, adv, mask, **LOSSES[name][1])
    if LOSSES[name][0]["agg_mode"].startswith("seq-mean"):  # TRL divides by all 8 rows, ours by the 4 with tokens
        torch.testing.assert_close(full.detach() * 8 / 4, ours.detach(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", ["gspo", "luspo"])
def test_long_sequences_keep_the_sequence_ratio_exact(name):
    """10,000 tokens each 0.01 nats above the old policy: the product of the token ratios is exp(100) (and
    exp(-100) the other way), past float32's range; the log-space mean gives the sequence ratio exp(+-0.01)
    exactly, as TRL's does, and the gradient stays finite."""
    T = 10_000
    old = torch.full((2, T), -2.0, dtype=torch.float64)
    logp = (old + torch.tensor([[0.01], [-0.01]], dtype=torch.float64)).requires_grad_()
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    mask = mask_from_lengths(torch.tensor([T, T - 17]), T)
    ours, theirs, g_ours, g_theirs, m = _both(name, logp, old, adv, mask)
    assert float(m["ratio_max"]) == pytest.approx(math.exp(0.01), rel=1e-7)  # (metrics are float32)
    assert torch.isfinite(g_ours).all()
    torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-6)
    torch.testing.assert_close(g_ours, g_theirs, rtol=0, atol=1e-9)
    # and in float32, the trainer's precision: still exp(0.01), no underflow
    _, m32 = grpo_loss(logp.detach().float(), old.float(), adv.float(), mask, **LOSSES[name][0])
    assert float(m32["ratio_max"]) == pytest.approx(math.exp(0.01), rel=1e-5)


# ---- rollout-correction weights in the loss ---------------------------------------------------------------------
# The weights themselves equal TRL's own computation (its vLLM importance-sampling block, driven through the
# trainer in tests/grpo/test_losses_vs_trl.py::test_correction_weights_match_trl); here they go into the loss.

@pytest.mark.parametrize("mode", ["token_truncate", "sequence_truncate"])
@pytest.mark.parametrize("name", ["gspo", "cispo", "sapo"])
def test_truncated_weights_in_the_loss_equal_trl(name, mode):
    logp, old, adv, mask = _batch([12, 3, 1, 7, 5, 12, 2, 9], seed=5)
    rollout = old + torch.randn(old.shape, generator=torch.Generator().manual_seed(9), dtype=old.dtype) * 0.2
    w, keep, tis = correction_weights(old, rollout, mask, mode=mode, c_max=1.2, c_min=0.8, seq_ratio="product")
    assert tis["tis/clipped_share"] > 0 and torch.equal(keep, mask)
    _assert_equal(*_both(name, logp, old, adv, mask, is_weights=w)[:4])


@pytest.mark.parametrize("mode", ["token_mask", "sequence_mask"])
@pytest.mark.parametrize("name", ["gspo", "cispo", "sapo"])
def test_rejected_tokens_leave_the_loss(name, mode):
    """Mask modes: the trainer passes the loss mask without the rejected tokens (update.py). That equals TRL
    given the same kept mask; TRL's own behaviour (weight 0, token still in the mask) differs in every
    denominator, which is the pinned difference (verl #3915)."""
    logp, old, adv, mask = _batch([12, 3, 1, 7, 5, 12, 2, 9], seed=6)
    rollout = old + torch.randn(old.shape, generator=torch.Generator().manual_seed(8), dtype=old.dtype) * 0.2
    lo, hi = (0.85, 1.15) if mode == "token_mask" else (0.95, 1.05)  # a sequence's mean ratio moves less
    w, keep, tis = correction_weights(old, rollout, mask, mode=mode, c_max=hi, c_min=lo, seq_ratio="geometric")
    assert 0 < tis["tis/masked_share"] < 1
    if mode == "sequence_mask":  # whole sequences leave the loss
        assert tis["tis/seq_all_masked_share"] > 0
    ours, _ = grpo_loss(logp, old, adv, keep, is_weights=w, **LOSSES[name][0])
    (g_ours,) = torch.autograd.grad(ours, logp)
    rows = keep.any(dim=-1)  # TRL given the kept mask, on the rows that still hold a token (see above)
    sub = logp.detach()[rows].clone().requires_grad_()
    theirs = trl_loss(sub, old[rows], adv[rows], keep[rows], is_ratio=w[rows], **LOSSES[name][1])
    (g_sub,) = torch.autograd.grad(theirs, sub)
    g_theirs = torch.zeros_like(g_ours)
    g_theirs[rows] = g_sub
    _assert_equal(ours, theirs, g_ours, g_theirs)
    trl_keeps_them = trl_loss(logp, old, adv, mask, is_ratio=w, **LOSSES[name][1])
    assert abs(float(trl_keeps_them - ours)) > 1e-4


# ---- the geometric sequence ratio (not in TRL) ------------------------------------------------------------------
# TRL's sequence modes use the product of the token ratios (tested above and in test_losses_vs_trl.py). The
# geometric one, exp(mean_t log rho_t), is verl's geometric rejection sampling (docs/algo/rollout_corr_math.md,
# "geometric-level RS"); TRL has no counterpart to call, so the reference is that formula written out here in
# plain Python floats (math.fsum per sequence), independent of our tensor code.

def _geometric_reference(trainer, rollout, lengths, lo, hi):
    out = []
    for b, n in enumerate(lengths):
        mean = math.fsum(float(trainer[b, t]) - float(rollout[b, t]) for t in range(n)) / n if n else 0.0
        rho = math.exp(mean)
        out.append((rho, lo <= rho <= hi))
    return out


def test_sequence_mask_geometric_matches_the_written_out_formula_and_keeps_long_answers():
    lengths = [12, 3, 1, 0, 7, 12]
    _, trainer, _, mask = _batch(lengths, seed=12)
    rollout = trainer + torch.randn(trainer.shape, generator=torch.Generator().manual_seed(2), dtype=trainer.dtype) * 0.1
    w, keep, tis = correction_weights(trainer, rollout, mask, mode="sequence_mask", c_min=0.95, c_max=1.05)
    for b, (rho, kept) in enumerate(_geometric_reference(trainer, rollout, lengths, 0.95, 1.05)):
        if lengths[b]:
            assert bool(keep[b].any()) == kept
            assert float(w[b, 0]) == pytest.approx(rho if kept else 0.0, rel=1e-12, abs=1e-12)
    assert tis["tis/seq_masked_share"] == pytest.approx(sum(not k for (_, k), n in zip(
        _geometric_reference(trainer, rollout, lengths, 0.95, 1.05), lengths) if n) / 5)
    # 20,000 tokens each 0.002 nats apart: the product of the ratios is exp(40), saturated (and masked by any
    # bound); the geometric mean is exp(0.002), kept by [0.9, 1.1] in float32 as in float64.
    T = 20_000
    tr = torch.full((1, T), -1.0)
    ro = tr - 0.002
    m = torch.ones(1, T, dtype=torch.bool)
    w32, keep32, _ = correction_weights(tr, ro, m, mode="sequence_mask", c_min=0.9, c_max=1.1)
    assert bool(keep32.all()) and float(w32[0, 0]) == pytest.approx(math.exp(0.002), rel=1e-5)
    wp, keepp, _ = correction_weights(tr, ro, m, mode="sequence_mask", c_min=0.9, c_max=1.1, seq_ratio="product")
    assert not bool(keepp.any()) and torch.isfinite(wp).all()


def _defaults(name):
    from rlvr_core.experiment.config import GRPOConfig

    return GRPOConfig(policy_loss=name).policy_loss_params()  # the documented defaults (None: ppo_clip's clips)


def test_on_policy_every_loss_has_ppos_gradient():
    # At ratio 1 (logp = old_logp: one epoch on fresh rollouts) ppo_clip, gspo, cispo and sapo all reduce to
    # A * grad log p with the same token-mean aggregation, so they train the same model: the demo-losses sweep's
    # first run (one epoch per step) gave four identical cells, step-1 grad norms within 2e-6
    # (docs/grpo_training.md, "Sweeps: losses and distillation"). The loss values themselves differ.
    logp, old, adv, mask = _batch([12, 3, 1, 7, 5, 12, 2, 9])
    on = old.clone().requires_grad_()
    grads, values = {}, {}
    for name in ("ppo_clip", "gspo", "cispo", "sapo"):
        loss, _ = grpo_loss(on, old, adv, mask, policy_loss=name, agg_mode="token-mean", loss_params=_defaults(name))
        (grads[name],) = torch.autograd.grad(loss, on)
        values[name] = float(loss)
    for name in ("gspo", "cispo", "sapo"):
        torch.testing.assert_close(grads[name], grads["ppo_clip"], rtol=0, atol=1e-12)
    assert len({round(v, 9) for v in values.values()}) > 1, values  # different losses, one gradient
    # Off-policy (the second epoch of a step) they part: the same tensors with logp moved give four gradients.
    off = {}
    for name in ("ppo_clip", "gspo", "cispo", "sapo"):
        loss, _ = grpo_loss(logp, old, adv, mask, policy_loss=name, agg_mode="token-mean", loss_params=_defaults(name))
        (off[name],) = torch.autograd.grad(loss, logp)
    assert all((off[a] - off[b]).abs().max() > 1e-3 for a in off for b in off if a < b)
