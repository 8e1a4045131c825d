"""Per-token KL estimators between the policy and a frozen reference, and the β-weighted KL term.

Source: J. Schulman, "Approximating KL Divergence", http://joschu.net/blog/kl-approx.html.

Direction. The sampled tokens x come from the policy p = pi_theta (in practice from pi_old, which equals
pi_theta at the first update of a step). With q = pi_ref and r = q(x) / p(x) = exp(ref_logp - logp):

    k1 = -log r            = logp - ref_logp            unbiased for KL(p || q); high variance; can be < 0
    k2 = (log r)^2 / 2                                  biased (exact to 2nd order in log r); >= 0; low variance
    k3 = (r - 1) - log r                                unbiased for KL(p || q); >= 0; low variance

so all three estimate the *reverse* KL(pi_theta || pi_ref), the one in the GRPO objective. k3 is what
GRPO (DeepSeekMath eq. 4) and TRL use, and our default (`grpo.kl_estimator: k3`).

A caveat for using these as *losses* (not just metrics): differentiating the sample estimate w.r.t. theta
does not differentiate the sampling distribution. On-policy, the expected gradient of the k2 loss is
grad KL(p || q), that of the k3 loss is grad KL(q || p) (the *forward* KL: E_p[(1 - q/p) grad log p]
= -E_q[grad log p]), and that of k1 is zero (E_p[grad log p] = 0); see Tang & Munos 2025, "On a few
pitfalls in KL divergence gradient estimation for RL". We follow GRPO/TRL (k3) by default; the choice
stays in config.

Precision: inputs may be bfloat16; the difference logp - ref_logp is formed in float32 (float64 stays),
because a bfloat16 log-prob near -5 has a resolution of ~0.03 and the difference of two such numbers
is mostly rounding. The log-ratio is clamped to [-20, 20] before exp so a garbage or extreme token
cannot overflow to inf and poison the batch (the value and gradient saturate beyond that).
"""

from __future__ import annotations

from typing import Callable

import torch

from rlvr_core.core.registry import KL_ESTIMATORS, register

__all__ = ["KLEstimator", "register_kl_estimator", "get_kl_estimator", "known_kl_estimators",
           "kl_k1", "kl_k2", "kl_k3", "token_kl", "LOG_RATIO_CLAMP"]

LOG_RATIO_CLAMP = 20.0  # exp(20) ~ 5e8: far beyond any sane ratio, far below float32 overflow (exp(88))


def _diff(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """log p - log q, in float32 (float64 kept), shape (B, T)."""
    if logp.shape != ref_logp.shape:
        raise ValueError(f"logp {tuple(logp.shape)} and ref_logp {tuple(ref_logp.shape)} differ in shape")
    dt = torch.float64 if torch.float64 in (logp.dtype, ref_logp.dtype) else torch.float32
    return logp.to(dt) - ref_logp.to(dt)


# Each estimator below registers itself (`@register("kl_estimator", name)`); its name is also listed, torch-free,
# in rlvr_core/core/registry.py, so the config checks `grpo.kl_estimator` without importing this module.
KLEstimator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
register_kl_estimator = KL_ESTIMATORS.register  # decorator
get_kl_estimator = KL_ESTIMATORS.get
known_kl_estimators = KL_ESTIMATORS.names


@register("kl_estimator", "k1")
def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 = log p(x) - log q(x). logp, ref_logp: (B, T). Returns (B, T) float32. Estimates KL(p || q)."""
    return _diff(logp, ref_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


@register("kl_estimator", "k2")
def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k2 = (log p(x) - log q(x))^2 / 2. logp, ref_logp: (B, T). Returns (B, T) float32, >= 0."""
    d = _diff(logp, ref_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return 0.5 * d * d


@register("kl_estimator", "k3")
def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 = (r - 1) - log r with r = q(x) / p(x). logp, ref_logp: (B, T). Returns (B, T) float32, >= 0.

    Non-negative because log r <= r - 1 for every r > 0; unbiased for KL(p || q) because E_p[r] = 1.
    expm1 keeps precision when r is close to 1 (the usual case: policy near the reference).
    """
    log_r = (-_diff(logp, ref_logp)).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    # max(., 0) only removes rounding noise: mathematically the value is already >= 0.
    return (torch.expm1(log_r) - log_r).clamp(min=0.0)


def token_kl(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token KL(pi_theta || pi_ref) estimate by registered name ("k1", "k2", "k3"). (B, T) -> (B, T)."""
    return get_kl_estimator(estimator)(logp, ref_logp)
