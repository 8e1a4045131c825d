"""Policy losses and loss aggregation: pure tensor functions, registered by name.

Shapes: B sequences (completions), T response positions (right-padded). Every per-token input is (B, T):
    logp       log pi_theta(token) of the sampled tokens, with gradient
    old_logp   log pi_old(token), the behaviour policy that sampled them (no gradient)
    mask       response mask, True/1 on real response tokens. Build it from lengths with
               `mask_from_lengths`, never from token values: the pad id can be a real token (G-pad-mask:
               Qwen3's id 0 is "!", and trimming at it left real tokens with log-prob 0 and KL > 100).
Padding positions may hold anything (0, pad log-probs, inf, nan): they are replaced by 0 *before* any
arithmetic, so neither the loss nor the gradient can see them.

Precision: logp and old_logp are typically bfloat16 from the model. The ratio exp(logp - old_logp) is
formed in float32 (float64 inputs stay float64): the difference of two bfloat16 log-probs near -5 has
~0.03 resolution, which alone would make on-policy ratios scatter by +-3% and trip the clip. Losses and
metrics come back float32; the gradient flows back into the bfloat16 input through the cast.

Papers:
    PPO-clip     Schulman et al. 2017, https://arxiv.org/abs/1707.06347
    GRPO         Shao et al. 2024, https://arxiv.org/abs/2402.03300 (per-sequence mean, then mean over sequences)
    DAPO         Yu et al. 2025, https://arxiv.org/abs/2503.14476 (clip-higher eps_low/eps_high; token-level loss)
    Dr.GRPO      Liu et al. 2025, https://arxiv.org/abs/2503.20783 (token sum over a constant normaliser)
    TIS          Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"
                 (truncated importance sampling between the rollout engine and the trainer; verl, TRL)
"""

from __future__ import annotations

from typing import Callable

import torch

from rlvr_core.core.registry import LOSS_AGGS, POLICY_LOSSES, register
from rlvr_core.grpo.advantages import advantages_to_tokens, lowprob_token_weights
from rlvr_core.grpo.kl import LOG_RATIO_CLAMP, token_kl

__all__ = [
    "mask_from_lengths",
    "LossAgg", "register_loss_agg", "get_loss_agg", "known_loss_aggs", "aggregate_loss",
    "PolicyLossFn", "register_policy_loss", "get_policy_loss", "known_policy_losses",
    "ppo_clip_loss", "ratio_metrics", "grpo_loss", "truncated_is_weights",
]


def mask_from_lengths(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    """Response mask from response lengths: mask[b, t] = t < lengths[b]. lengths: (B,) int. Returns (B, T) bool."""
    lengths = torch.as_tensor(lengths)
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be (B,), got {tuple(lengths.shape)}")
    if lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > max_len):
        raise ValueError(f"lengths must lie in [0, {max_len}], got [{int(lengths.min())}, {int(lengths.max())}]")
    return torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]


def _float(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _masked(x: torch.Tensor, m: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x in `dtype` with padding replaced by 0 (torch.where, so inf/nan there cannot leak into grads)."""
    return torch.where(m, x.to(dtype), torch.zeros((), dtype=dtype, device=x.device))


def _check(mask: torch.Tensor, *tensors: torch.Tensor) -> torch.Tensor:
    if mask.dim() != 2:
        raise ValueError(f"mask must be (B, T), got {tuple(mask.shape)}")
    for t in tensors:
        if t.shape != mask.shape:
            raise ValueError(f"tensor shape {tuple(t.shape)} != mask shape {tuple(mask.shape)}")
    return mask.bool()


# ---- aggregation --------------------------------------------------------------------------------------------
#
# How a (B, T) loss matrix becomes a scalar decides how much each token and each sequence weighs:
#   token-mean               every token in the batch weighs the same (DAPO): long answers are not diluted.
#   seq-mean-token-mean      every sequence weighs the same (GRPO paper): a token of a short answer weighs
#                            more, which Dr.GRPO shows biases towards short correct / long wrong answers.
#   seq-mean-token-sum-norm  token sum over a constant (Dr.GRPO): unbiased; the constant only rescales lr.
#
# With micro-batches / gradient accumulation the normaliser must be the *whole* batch's (number of tokens,
# number of sequences), or the loss becomes a mean of micro-batch means and the weighting above is lost.
# Pass num_tokens / num_seqs for that; then the micro-batch losses add up to the full-batch loss.
#
# The aggregations and policy losses below register themselves (`@register("loss_agg" / "policy_loss", name)`);
# their names are also listed, torch-free, in rlvr_core/core/registry.py, so the config checks `grpo.loss_agg`
# and `grpo.policy_loss` without importing this module.

LossAgg = Callable[..., torch.Tensor]
register_loss_agg = LOSS_AGGS.register  # decorator
get_loss_agg = LOSS_AGGS.get
known_loss_aggs = LOSS_AGGS.names


@register("loss_agg", "token-mean")
def _token_mean(loss_mat: torch.Tensor, mask: torch.Tensor, *, norm_len: int | None = None,
                num_tokens: float | None = None, num_seqs: float | None = None) -> torch.Tensor:
    """sum_{b,t} mask*L / (number of response tokens in the batch). DAPO's token-level loss."""
    denom = mask.sum().clamp(min=1) if num_tokens is None else num_tokens
    return loss_mat.sum() / denom


@register("loss_agg", "seq-mean-token-mean")
def _seq_mean_token_mean(loss_mat: torch.Tensor, mask: torch.Tensor, *, norm_len: int | None = None,
                         num_tokens: float | None = None, num_seqs: float | None = None) -> torch.Tensor:
    """mean over sequences of (sum_t mask*L / |o_b|). GRPO as written in DeepSeekMath.

    A sequence with no response token (an empty completion, or one whose every token a rollout-correction
    mask mode rejected) is not counted in the denominator (verl #3915: counting it shrinks every other
    sequence's weight). TRL counts it; tests/grpo/test_policy_losses_vs_trl.py pins the difference.
    """
    per_seq = loss_mat.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)
    return per_seq.sum() / (_n_seqs(mask) if num_seqs is None else num_seqs)


def _n_seqs(mask: torch.Tensor) -> torch.Tensor:
    """Sequences holding at least one response token (at least 1, so an all-empty batch gives loss 0)."""
    return (mask.sum(dim=-1) > 0).sum().clamp(min=1)


@register("loss_agg", "seq-mean-token-sum")
def _seq_mean_token_sum(loss_mat: torch.Tensor, mask: torch.Tensor, *, norm_len: int | None = None,
                        num_tokens: float | None = None, num_seqs: float | None = None) -> torch.Tensor:
    """mean over sequences of (sum_t mask*L): each sequence's token sum, so a sequence weighs by its length.

    verl's "seq-mean-token-sum"; with a sequence-level policy loss (`gspo`) it is LUSPO's length-unbiased
    aggregation (TRL's loss_type="luspo"). Sequences with no response token are not counted (as above).
    """
    return loss_mat.sum() / (_n_seqs(mask) if num_seqs is None else num_seqs)


@register("loss_agg", "seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(loss_mat: torch.Tensor, mask: torch.Tensor, *, norm_len: int | None = None,
                             num_tokens: float | None = None, num_seqs: float | None = None) -> torch.Tensor:
    """sum_{b,t} mask*L / (number of sequences * norm_len). Dr.GRPO's constant normaliser.

    Sequences with no response token are not counted (as seq-mean-token-mean). norm_len must be a constant
    of the run (the generation cap, max_new_tokens); the padded width T of this batch is *not* used as a fallback because it changes from batch to batch, which would bring
    back a length-dependent weighting. Same normaliser as TRL's "dr_grpo" (verl omits the 1/B).
    """
    if norm_len is None or norm_len <= 0:
        raise ValueError("seq-mean-token-sum-norm needs norm_len > 0 (a constant, e.g. max response length)")
    n = _n_seqs(mask) if num_seqs is None else num_seqs
    return loss_mat.sum() / (n * norm_len)


def aggregate_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean", *,
                   norm_len: int | None = None, num_tokens: float | None = None,
                   num_seqs: float | None = None) -> torch.Tensor:
    """Scalar from a per-token loss matrix. loss_mat, mask: (B, T); padding is zeroed first. Returns 0-dim."""
    m = _check(mask, loss_mat)
    agg = get_loss_agg(mode)
    return agg(_masked(loss_mat, m, _float(loss_mat)), m, norm_len=norm_len, num_tokens=num_tokens,
               num_seqs=num_seqs)


# ---- policy losses ------------------------------------------------------------------------------------------

# fn(logp, old_logp, advantages, mask, *, clip_low, clip_high, agg_mode, norm_len, num_tokens, num_seqs)
#   -> (scalar loss, metrics dict of detached 0-dim tensors)
PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
register_policy_loss = POLICY_LOSSES.register  # decorator
get_policy_loss = POLICY_LOSSES.get
known_policy_losses = POLICY_LOSSES.names


def _masked_mean(x: torch.Tensor, m: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    # nan (not 0) for an empty mask: "no tokens" must not look like "ratio 0" or "no clipping".
    s = torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum()
    return torch.where(n > 0, s / n.clamp(min=1), torch.full_like(s, torch.nan))


@register("policy_loss", "ppo_clip")
def ppo_clip_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                  clip_low: float = 0.2, clip_high: float = 0.28, agg_mode: str = "token-mean",
                  norm_len: int | None = None, num_tokens: float | None = None, num_seqs: float | None = None,
                  is_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate with clip-higher (separate eps_low / eps_high, DAPO sec. 3.1).

        ratio = exp(logp - old_logp)
        L_t   = -min(ratio * A_t, clip(ratio, 1 - clip_low, 1 + clip_high) * A_t)   [* w_t with is_weights]
        loss  = aggregate(L, mask, agg_mode)

    Why clip-higher: with a symmetric 0.2, a token at p_old = 0.01 can only rise to 0.012 per step while
    one at 0.9 may rise to 1.08; raising only the upper bound (DAPO: 0.28) lets unlikely-but-good tokens
    grow, which keeps entropy from collapsing. The lower bound stays 0.2 so bad tokens are not crushed.

    logp: (B, T) with grad; old_logp: (B, T) (detached here); advantages: (B,) per sequence or (B, T)
    per token; mask: (B, T). clip_low, clip_high > 0. agg_mode: see `known_loss_aggs()`.
    The log-ratio is clamped to [-20, 20] so one extreme token cannot overflow exp. is_weights: optional (B, T)
    per-token importance weights (truncated importance sampling, `truncated_is_weights`), detached here: each
    token's term is multiplied by its weight. None = no weighting (the loss is computed exactly as without it).

    Returns (loss: 0-dim float32 with grad, metrics) where metrics (detached 0-dim, over response tokens)
    are: ratio_mean, ratio_max, ratio_min; clip_frac_low (A < 0 and ratio < 1 - clip_low: the token's
    gradient is cut), clip_frac_high (A > 0 and ratio > 1 + clip_high), clip_frac (their sum);
    approx_kl_old_new, the k3 estimate of KL(pi_old || pi_theta) (samples are from pi_old; r = ratio):
    mean of (r - 1) - log r. At staleness 0 the ratio must be 1 and both clip fractions 0; anything else
    means trainer and sampler disagree (G-onpolicy-ratio, G-logprob-temp).
    """
    if clip_low <= 0 or clip_high <= 0 or clip_low >= 1:
        raise ValueError(f"need 0 < clip_low < 1 and clip_high > 0, got {clip_low}, {clip_high}")
    if advantages.dim() == 1:
        adv_src = advantages_to_tokens(advantages, mask)
    else:
        adv_src = advantages
    m = _check(mask, logp, old_logp, adv_src)
    dt = torch.float64 if torch.float64 in (logp.dtype, old_logp.dtype, adv_src.dtype) else torch.float32
    lp = _masked(logp, m, dt)
    olp = _masked(old_logp.detach(), m, dt)
    adv = _masked(adv_src.detach(), m, dt)

    log_ratio = (lp - olp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    surr = ratio * adv
    surr_clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    if is_weights is None:
        per_token = _masked(-torch.minimum(surr, surr_clipped), m, dt)
    else:
        _check(mask, is_weights)
        per_token = _masked(-torch.minimum(surr, surr_clipped) * _masked(is_weights.detach(), m, dt), m, dt)
    loss = get_loss_agg(agg_mode)(per_token, m, norm_len=norm_len, num_tokens=num_tokens, num_seqs=num_seqs)

    low = m & (adv < 0) & (ratio < 1.0 - clip_low)
    high = m & (adv > 0) & (ratio > 1.0 + clip_high)
    return loss, ratio_metrics(ratio, log_ratio, m, dt, low, high)


def ratio_metrics(ratio: torch.Tensor, log_ratio: torch.Tensor, m: torch.Tensor, dt: torch.dtype,
                  low: torch.Tensor, high: torch.Tensor) -> dict[str, torch.Tensor]:
    """The ratio metrics every policy loss reports, detached, float32, over the response tokens m (nan for an
    empty mask): ratio_mean/max/min, clip_frac_low / clip_frac_high (the (B, T) bool masks `low` / `high` of
    tokens the loss clipped), clip_frac, approx_kl_old_new (k3 of KL(pi_old || pi_theta) from log_ratio).
    ratio / log_ratio may be (B, T) or a per-sequence (B, 1) that every token of the sequence shares."""
    with torch.no_grad():
        n = m.sum()
        r, lr = ratio.detach().expand(m.shape), log_ratio.detach().expand(m.shape)
        inf = torch.tensor(torch.inf, dtype=dt, device=r.device)
        nan = torch.tensor(torch.nan, dtype=dt, device=r.device)
        out = {
            "ratio_mean": _masked_mean(r, m, n),
            "ratio_max": torch.where(n > 0, torch.where(m, r, -inf).max(), nan),
            "ratio_min": torch.where(n > 0, torch.where(m, r, inf).min(), nan),
            "clip_frac_low": _masked_mean(low.to(dt), m, n),
            "clip_frac_high": _masked_mean(high.to(dt), m, n),
            "clip_frac": _masked_mean((low | high).to(dt), m, n),
            "approx_kl_old_new": _masked_mean(torch.expm1(lr) - lr, m, n),
        }
    return {k: v.float() for k, v in out.items()}


# ---- the GRPO objective -------------------------------------------------------------------------------------

def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
              ref_logp: torch.Tensor | None = None, beta: float = 0.0, kl_estimator: str = "k3",
              policy_loss: str = "ppo_clip", clip_low: float = 0.2, clip_high: float = 0.28,
              agg_mode: str = "token-mean", norm_len: int | None = None, lowprob_c: float = 0.0,
              num_tokens: float | None = None, num_seqs: float | None = None,
              is_weights: torch.Tensor | None = None,
              loss_params: dict | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The full per-step objective: policy loss on (optionally reweighted) advantages + beta * KL to the reference.

        A'_t  = A_t * (1 + c - c * exp(old_logp_t))          (Δlog p reweighting; c = lowprob_c, 0 = off)
        loss  = policy_loss(logp, old_logp, A', mask[, w]) + beta * aggregate(k(logp, ref_logp), mask)

    is_weights: optional (B, T) per-token importance weights w (truncated importance sampling: see
    `truncated_is_weights`), no gradient. They multiply each token's *policy* term before aggregation, as
    verl and TRL do; the KL term is not weighted. None (the default) = today's loss bit for bit: the policy
    loss is called exactly as without the option.

    The KL term uses the same aggregation as the policy term (as verl does), so beta means the same thing
    per token in every mode. beta = 0 needs no reference model: ref_logp may be None. When ref_logp is
    given, KL metrics are reported even with beta = 0 (cheap, and the G-kl-explosion detector wants them).

    loss_params: the policy loss's own parameters (`GRPOConfig.policy_loss_params`: gspo's clip_low/clip_high,
    cispo's clip_max, sapo's tau_pos/tau_neg; policy_losses.py); None = clip_low / clip_high, as for ppo_clip.

    Shapes as `ppo_clip_loss`; ref_logp: (B, T) or None.
    Returns (loss, metrics): metrics = the policy loss metrics + pg_loss, loss, and, with a reference,
    kl_loss (the aggregated term before beta), kl_ref_mean and kl_ref_max (token-level, for spike detection).
    """
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    if beta > 0 and ref_logp is None:
        raise ValueError("beta > 0 needs ref_logp (log-probs of the sampled tokens under the reference model)")
    adv = advantages_to_tokens(advantages, mask) if advantages.dim() == 1 else advantages
    if lowprob_c:
        adv = adv.detach().to(_float(adv)) * lowprob_token_weights(old_logp, lowprob_c).to(_float(adv))
    extra = {} if is_weights is None else {"is_weights": is_weights}
    params = dict(clip_low=clip_low, clip_high=clip_high) if loss_params is None else dict(loss_params)
    pg, metrics = get_policy_loss(policy_loss)(
        logp, old_logp, adv, mask, agg_mode=agg_mode, norm_len=norm_len, num_tokens=num_tokens,
        num_seqs=num_seqs, **params, **extra)
    loss = pg
    metrics = dict(metrics, pg_loss=pg.detach().float())
    if ref_logp is not None:
        m = _check(mask, ref_logp)
        # zero both sides on padding so garbage there gives KL 0, not inf (and no nan gradient)
        dt = _float(logp)
        kl_tok = token_kl(_masked(logp, m, dt), _masked(ref_logp.detach(), m, dt), kl_estimator)
        kl_tok = _masked(kl_tok, m, kl_tok.dtype)
        kl_loss = get_loss_agg(agg_mode)(kl_tok, m, norm_len=norm_len, num_tokens=num_tokens, num_seqs=num_seqs)
        if beta > 0:
            loss = loss + beta * kl_loss
        with torch.no_grad():
            n = m.sum()
            metrics["kl_loss"] = kl_loss.detach().float()
            metrics["kl_ref_mean"] = _masked_mean(kl_tok.detach(), m, n).float()
            neg_inf = torch.tensor(-torch.inf, dtype=kl_tok.dtype, device=kl_tok.device)
            metrics["kl_ref_max"] = torch.where(n > 0, torch.where(m, kl_tok.detach(), neg_inf).max(),
                                                torch.full_like(neg_inf, torch.nan)).float()
    metrics["loss"] = loss.detach().float()
    return loss, metrics


# ---- truncated importance sampling (rollout engine vs trainer) ----------------------------------------------

def truncated_is_weights(trainer_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor,
                         cap: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token truncated importance weights w = min(exp(trainer_logp - rollout_logp), cap), no gradient.

    The rollout engine samples from its own numerics (bf16 kernels, vLLM), so the distribution that drew the
    tokens (rollout_logp) is not quite the trainer's (trainer_logp: the trainer's log-probs of the same
    tokens under the same weights, before any update of the step). w corrects the policy gradient for that
    mismatch; the cap bounds its variance (verl's TIS, TRL's vllm_importance_sampling_correction in
    "token_truncate" mode). All inputs (B, T); padding gives w = 1 (and is masked by the loss anyway).

    Returns (w (B, T) float32/float64, metrics over the response tokens: tis/weight_mean, the mean weight
    after the cap, and tis/clipped_share, the share of tokens whose raw ratio exceeded the cap; nan when
    the mask is empty).
    """
    if cap <= 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    m = _check(mask, trainer_logp, rollout_logp)
    dt = _float(trainer_logp)
    with torch.no_grad():
        log_ratio = _masked(trainer_logp.detach(), m, dt) - _masked(rollout_logp.detach(), m, dt)
        raw = torch.exp(log_ratio.clamp(max=LOG_RATIO_CLAMP))
        w = torch.where(m, raw.clamp(max=cap), torch.ones((), dtype=dt, device=raw.device))
        n = m.sum()
        metrics = {"tis/weight_mean": _masked_mean(w, m, n).float(),
                   "tis/clipped_share": _masked_mean((raw > cap).to(dt), m, n).float()}
    return w, metrics

