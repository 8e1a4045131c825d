"""Rollout correction: weights that correct the policy gradient for the rollout engine's own numerics.

The engine that sampled the tokens (bf16 kernels, vLLM) gives them log-probs `rollout_logp` that are not quite
the trainer's `trainer_logp` for the same tokens under the same weights. With a correction on (`grpo.tis_cap`
set) the PPO ratio's old log-probs are the trainer's and each token's policy term is multiplied by a weight
w built from rho = exp(trainer_logp - rollout_logp) (no gradient). Modes (`grpo.tis_mode`; TRL 1.16's
vllm_importance_sampling_mode, verl's rollout-correction presets):

    token_truncate     w_t = clip(rho_t, C_min, C_max)                   (TIS; today's default)
    token_mask         w_t = rho_t if C_min <= rho_t <= C_max else 0     (MIS, token level)
    sequence_truncate  w_t = clip(rho_seq, C_min, C_max) on every token of the sequence
    sequence_mask      w_t = rho_seq if C_min <= rho_seq <= C_max else 0 on every token of the sequence

C_max = `grpo.tis_cap`, C_min = `grpo.tis_min` (None: no lower bound). rho_seq is the sequence's ratio from
the sum of its token log-ratios, always in log space: `grpo.tis_seq_ratio` "geometric" (default) takes their
mean, exp(mean_t log rho_t), the length-normalised ratio of verl's geometric rejection sampling, whose
bounds mean the same for a 10-token and a 10,000-token answer; "product" takes their sum, exp(sum_t log
rho_t), TRL's and verl's sequence-level IS (the log-sum is clamped to [-20, 20] before exp, so it saturates
instead of under- or overflowing).

A rejected token (mask modes, w = 0) leaves the loss: the trainer drops it from the loss mask, so it is not
counted in the token denominator, and a sequence with every token rejected is not counted in the sequence
denominator either (verl #3915; losses.py). `correction_weights` returns the keep mask for that.
"""

from __future__ import annotations

import math

import torch

from rlvr_core.grpo.kl import LOG_RATIO_CLAMP
from rlvr_core.grpo.losses import _check, _float, _masked, _masked_mean

__all__ = ["CORRECTION_MODES", "SEQ_RATIOS", "correction_weights"]

CORRECTION_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
SEQ_RATIOS = ("geometric", "product")


def _log_rho(trainer_logp, rollout_logp, m, dt, mode, seq_ratio) -> torch.Tensor:
    """log rho: (B, T) per token, or (B, 1) per sequence (sum or mean of the token log-ratios, log space)."""
    diff = _masked(trainer_logp.detach(), m, dt) - _masked(rollout_logp.detach(), m, dt)
    if mode.startswith("token"):
        return diff.clamp(max=LOG_RATIO_CLAMP)  # as truncated_is_weights: token_truncate's weights bit for bit
    total = diff.sum(dim=-1, keepdim=True)
    if seq_ratio == "geometric":
        total = total / m.sum(dim=-1, keepdim=True).clamp(min=1)
    return total.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def correction_weights(trainer_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, *,
                       mode: str = "token_truncate", c_max: float, c_min: float | None = None,
                       seq_ratio: str = "geometric") -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """(w (B, T), keep (B, T) bool, metrics), no gradient. keep = mask minus the rejected tokens (mask modes).

    Padding gets w = 1. Metrics (0-dim float32; nan when the mask is empty), all over response tokens or
    over sequences holding at least one response token:
        tis/weight_mean          mean w over the tokens kept
        tis/clipped_share        tokens whose weight was truncated (truncate modes)
        tis/masked_share         tokens rejected (w = 0; mask modes)
        tis/seq_clipped_share    sequences with a truncated weight (token modes: any token)
        tis/seq_masked_share     sequences with a rejected token (sequence_mask: the sequence)
        tis/seq_all_masked_share sequences whose every token was rejected (they leave the loss)
        mismatch/log_ratio_mean  mean of trainer_logp - rollout_logp (the engines' mismatch, signed)
        mismatch/kl              k3 estimate of KL(rollout || trainer): mean of (rho - 1) - log rho
    """
    if mode not in CORRECTION_MODES:
        raise ValueError(f"unknown rollout-correction mode {mode!r}; known: {list(CORRECTION_MODES)}")
    if seq_ratio not in SEQ_RATIOS:
        raise ValueError(f"unknown sequence ratio {seq_ratio!r}; known: {list(SEQ_RATIOS)}")
    if c_max <= 0 or (c_min is not None and not 0 <= c_min < c_max):
        raise ValueError(f"need c_max > 0 and 0 <= c_min < c_max, got c_min={c_min}, c_max={c_max}")
    m = _check(mask, trainer_logp, rollout_logp)
    dt = _float(trainer_logp)
    lo = -math.inf if c_min is None else c_min
    with torch.no_grad():
        rho = torch.exp(_log_rho(trainer_logp, rollout_logp, m, dt, mode, seq_ratio)).expand(m.shape)
        outside = (rho < lo) | (rho > c_max)
        masking = mode.endswith("mask")
        w = torch.where(outside, torch.zeros_like(rho), rho) if masking else rho.clamp(min=lo, max=c_max)
        w = torch.where(m, w, torch.ones_like(w))
        hit = m & outside
        keep = m & ~hit if masking else m
        metrics = _metrics(trainer_logp, rollout_logp, m, keep, hit, masking, w, dt)
    return w, keep, metrics


def _metrics(trainer_logp, rollout_logp, m, keep, hit, masking, w, dt) -> dict[str, torch.Tensor]:
    n, n_keep = m.sum(), keep.sum()
    has = m.any(dim=-1)                               # sequences holding a response token
    n_seq = has.sum()
    seq_hit = hit.any(dim=-1) & has
    zero = torch.zeros((), dtype=dt, device=w.device)
    nan = torch.full((), torch.nan, dtype=dt, device=w.device)

    def seq_share(x: torch.Tensor) -> torch.Tensor:
        return torch.where(n_seq > 0, x.sum().to(dt) / n_seq.clamp(min=1), nan)

    log_rho = (_masked(trainer_logp.detach(), m, dt) - _masked(rollout_logp.detach(), m, dt)).clamp(
        -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    out = {
        "tis/weight_mean": torch.where(n > 0, _masked_mean(w, keep, n_keep) if n_keep else zero, nan),
        "tis/clipped_share": zero + 0 if masking else _masked_mean(hit.to(dt), m, n),
        "tis/masked_share": _masked_mean(hit.to(dt), m, n) if masking else zero + 0,
        "tis/seq_clipped_share": zero + 0 if masking else seq_share(seq_hit),
        "tis/seq_masked_share": seq_share(seq_hit) if masking else zero + 0,
        "tis/seq_all_masked_share": seq_share(has & ~keep.any(dim=-1)),
        "mismatch/log_ratio_mean": _masked_mean(log_rho, m, n),
        "mismatch/kl": _masked_mean(torch.expm1(log_rho) - log_rho, m, n),
    }
    if not bool(n > 0):  # no response token: every share is unknown, not 0
        out = {k: nan for k in out}
    return {k: v.float() for k, v in out.items()}
