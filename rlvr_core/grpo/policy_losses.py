"""The policy losses beside PPO-clip (losses.py): sequence-level ratios (GSPO, LUSPO), CISPO and SAPO.

Each registers itself as a `policy_loss` (`grpo.policy_loss`) and has the contract of `ppo_clip_loss`:

    fn(logp, old_logp, advantages, mask, *, agg_mode, norm_len, num_tokens, num_seqs, is_weights, **params)
        -> (scalar loss, metrics: ratio_mean/max/min, clip_frac(_low/_high), approx_kl_old_new)

logp (B, T) with gradient, old_logp (B, T) (detached here), advantages (B,) or (B, T), mask (B, T) from
lengths; padding is zeroed before any arithmetic (losses.py). is_weights: optional (B, T) rollout-correction
weights (rollout_correction.py), detached, multiplying each token's policy term. Their parameters are
GRPOConfig fields (`gspo_clip_low`, `cispo_clip_max`, `sapo_tau_pos`, ...; `GRPOConfig.policy_loss_params`).

Every formula is TRL 1.16's `GRPOTrainer._compute_loss` (trl/trainer/grpo_trainer.py), which
tests/grpo/test_policy_losses_vs_trl.py calls on the same tensors (loss and gradient to 1e-6):
    gspo   importance_sampling_level="sequence", loss_type="grpo"     (Zheng et al. 2025, arXiv 2507.18071)
    luspo  importance_sampling_level="sequence", loss_type="luspo"    (arXiv 2602.05261)
    cispo  loss_type="cispo", epsilon_high = clip_max                 (MiniMax-M1, arXiv 2506.13585)
    sapo   loss_type="sapo", sapo_temperature_pos/neg = tau_pos/neg   (arXiv 2511.20347)
"""

from __future__ import annotations

import torch

from rlvr_core.core.registry import register
from rlvr_core.grpo.advantages import advantages_to_tokens
from rlvr_core.grpo.kl import LOG_RATIO_CLAMP
from rlvr_core.grpo.losses import _check, _masked, get_loss_agg, ratio_metrics

__all__ = ["sequence_log_ratio", "gspo_loss", "luspo_loss", "cispo_loss", "sapo_loss"]

LUSPO_AGG = "seq-mean-token-sum"  # LUSPO's definition: each sequence's loss summed over its tokens


def _inputs(logp, old_logp, advantages, mask):
    """(m, dtype, logp, old_logp, adv) with padding zeroed; float64 if any input is, else float32."""
    adv_src = advantages_to_tokens(advantages, mask) if advantages.dim() == 1 else advantages
    m = _check(mask, logp, old_logp, adv_src)
    dt = torch.float64 if torch.float64 in (logp.dtype, old_logp.dtype, adv_src.dtype) else torch.float32
    return m, dt, _masked(logp, m, dt), _masked(old_logp.detach(), m, dt), _masked(adv_src.detach(), m, dt)


def _finish(per_token, m, is_weights, dt, agg_mode, norm_len, num_tokens, num_seqs):
    """Apply the rollout-correction weights (no gradient), zero padding and aggregate."""
    if is_weights is not None:
        _check(m, is_weights)
        per_token = per_token * _masked(is_weights.detach(), m, dt)
    return get_loss_agg(agg_mode)(_masked(per_token, m, dt), m, norm_len=norm_len, num_tokens=num_tokens,
                                  num_seqs=num_seqs)


def sequence_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, 1) mean over each sequence's response tokens of log pi_theta - log pi_old, with gradient.

    The mean is taken in log space, so the sequence ratio exp(mean) of a 10,000-token answer is as exact as
    a short one's (the product of per-token ratios would under- or overflow float32 past ~90 nats). A
    sequence with no response token gets log-ratio 0 (ratio 1); it carries no token to train anyway.
    Clamped to [-20, 20] like the token ratio, so one wild sequence cannot overflow exp.
    """
    m = _check(mask, logp, old_logp)
    dt = torch.float64 if torch.float64 in (logp.dtype, old_logp.dtype) else torch.float32
    diff = _masked(logp, m, dt) - _masked(old_logp.detach(), m, dt)
    mean = diff.sum(dim=-1, keepdim=True) / m.sum(dim=-1, keepdim=True).clamp(min=1)
    return mean.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _gspo_terms(logp, old_logp, advantages, mask, clip_low, clip_high):
    if clip_low <= 0 or clip_high <= 0 or clip_low >= 1:
        raise ValueError(f"need 0 < clip_low < 1 and clip_high > 0, got {clip_low}, {clip_high}")
    m, dt, _, _, adv = _inputs(logp, old_logp, advantages, mask)
    log_s = sequence_log_ratio(logp, old_logp, mask).to(dt)   # (B, 1)
    s = torch.exp(log_s)
    per_token = -torch.minimum(s * adv, s.clamp(1.0 - clip_low, 1.0 + clip_high) * adv)
    low = m & (adv < 0) & (s < 1.0 - clip_low)
    high = m & (adv > 0) & (s > 1.0 + clip_high)
    return m, dt, per_token, ratio_metrics(s, log_s, m, dt, low, high)


@register("policy_loss", "gspo")
def gspo_loss(logp, old_logp, advantages, mask, *, clip_low: float = 3e-4, clip_high: float = 4e-4,
              agg_mode: str = "seq-mean-token-mean", norm_len=None, num_tokens=None, num_seqs=None,
              is_weights=None):
    """GSPO: PPO's clipped surrogate on the sequence ratio s_b = exp(mean_t log(pi_theta / pi_old)).

        L_{b,t} = -min(s_b * A_{b,t}, clip(s_b, 1 - clip_low, 1 + clip_high) * A_{b,t})   on b's tokens

    The gradient of s_b flows through every token of b (GSPO, not GSPO-token). Clip bounds are about the
    sequence ratio, which moves far less than a token's: the paper uses 3e-4 / 4e-4 (the defaults). With
    agg_mode seq-mean-token-mean this is GSPO's objective (mean over sequences); the ratio metrics are the
    sequence ratio counted once per token.
    """
    m, dt, per_token, met = _gspo_terms(logp, old_logp, advantages, mask, clip_low, clip_high)
    return _finish(per_token, m, is_weights, dt, agg_mode, norm_len, num_tokens, num_seqs), met


@register("policy_loss", "luspo")
def luspo_loss(logp, old_logp, advantages, mask, *, clip_low: float = 3e-4, clip_high: float = 4e-4,
               agg_mode: str = LUSPO_AGG, norm_len=None, num_tokens=None, num_seqs=None, is_weights=None):
    """LUSPO, GSPO's length-unbiased form: the GSPO term of each sequence times its length, mean over
    sequences, i.e. `gspo` aggregated with seq-mean-token-sum. That aggregation is LUSPO's definition, so
    any other agg_mode is refused (the config refuses it before any work: GRPOConfig._loss_fits)."""
    if agg_mode != LUSPO_AGG:
        raise ValueError(f"luspo is gspo aggregated with {LUSPO_AGG!r} (its definition), got agg_mode {agg_mode!r}")
    m, dt, per_token, met = _gspo_terms(logp, old_logp, advantages, mask, clip_low, clip_high)
    return _finish(per_token, m, is_weights, dt, agg_mode, norm_len, num_tokens, num_seqs), met


@register("policy_loss", "cispo")
def cispo_loss(logp, old_logp, advantages, mask, *, clip_max: float = 5.0, agg_mode: str = "token-mean",
               norm_len=None, num_tokens=None, num_seqs=None, is_weights=None):
    """CISPO: REINFORCE with the clipped importance weight as a constant (stop-gradient) factor.

        L_{b,t} = -sg(min(r_{b,t}, clip_max)) * A_{b,t} * log pi_theta(o_{b,t}),   r = pi_theta / pi_old

    Unlike PPO-clip no token loses its gradient: a clipped token keeps the weight clip_max instead of being
    dropped, which MiniMax-M1 found keeps the rare "fork" tokens learning. clip_max is TRL's epsilon_high for
    cispo (an absolute bound on r; ScaleRL's recommended 5.0). clip_frac_high: tokens with A > 0 and r >
    clip_max (TRL's cispo_clip_ratio); no lower clip, so clip_frac_low is 0. The loss value is not a ratio
    surrogate (it contains log pi), only its gradient matters.
    """
    if clip_max <= 0:
        raise ValueError(f"need clip_max > 0, got {clip_max}")
    m, dt, lp, olp, adv = _inputs(logp, old_logp, advantages, mask)
    log_r = (lp - olp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    r = torch.exp(log_r)
    per_token = -r.clamp(max=clip_max).detach() * adv * lp
    met = ratio_metrics(r, log_r, m, dt, torch.zeros_like(m), m & (adv > 0) & (r > clip_max))
    return _finish(per_token, m, is_weights, dt, agg_mode, norm_len, num_tokens, num_seqs), met


@register("policy_loss", "sapo")
def sapo_loss(logp, old_logp, advantages, mask, *, tau_pos: float = 1.0, tau_neg: float = 1.05,
              agg_mode: str = "seq-mean-token-mean", norm_len=None, num_tokens=None, num_seqs=None,
              is_weights=None):
    """SAPO: a smooth gate instead of the hard clip.

        L_{b,t} = -(4 / tau) * sigmoid(tau * (r_{b,t} - 1)) * A_{b,t},   tau = tau_pos if A > 0 else tau_neg

    The gradient is r * sech^2(tau (r - 1) / 2) * A * grad log pi: exactly PPO's at r = 1, fading smoothly as
    the ratio leaves 1 instead of dropping to 0 at a clip edge. tau_neg > tau_pos damps negative updates
    faster (the paper's 1.05 vs 1.0). Nothing is clipped: the clip fractions are 0.
    """
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"need tau_pos, tau_neg > 0, got {tau_pos}, {tau_neg}")
    m, dt, lp, olp, adv = _inputs(logp, old_logp, advantages, mask)
    log_r = (lp - olp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    r = torch.exp(log_r)
    tau = torch.where(adv > 0, torch.tensor(tau_pos, dtype=dt), torch.tensor(tau_neg, dtype=dt)).to(r.device)
    per_token = -torch.sigmoid(tau * (r - 1)) * 4 / tau * adv
    none = torch.zeros_like(m)
    return _finish(per_token, m, is_weights, dt, agg_mode, norm_len, num_tokens, num_seqs), \
        ratio_metrics(r, log_r, m, dt, none, none)
