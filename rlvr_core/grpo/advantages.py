"""Advantage estimators, reward shaping and advantage reweighting: pure tensor functions.

Why this file exists: the advantage is the only place where the reward signal enters the policy loss, so
each estimator is a small function with one formula, registered by name so that the config value
`grpo.advantage: rloo` maps to exactly one function (the verl `core_algos.py` habit). Nothing here
touches a model, an optimiser or Prefect.

Layout contract. Rewards are *outcome* rewards, one scalar per completion, grouped by prompt:
    * a (B, G) tensor: row b holds the G completions of prompt b; or
    * a flat (B*G,) tensor with `group_size=G`: completions of one prompt are contiguous
      ([p0s0, p0s1, ..., p0s(G-1), p1s0, ...]); or
    * a flat (N,) tensor with `group_ids` (N,) int: ragged groups (adaptive sampling gives prompts
      different numbers of completions); ids need not be contiguous or sorted.
The output has the shape of the input rewards, dtype float32 (float64 stays float64), no gradient.

Precision: rewards may arrive as bfloat16; a bfloat16 mean over 16 rewards of 0/1 is exact, but a
bfloat16 std is not (8 bits of mantissa), so everything is computed in float32 (float64 if given).

Papers:
    GRPO      DeepSeekMath, Shao et al. 2024, https://arxiv.org/abs/2402.03300 (eq. for Â_{i,t}, outcome supervision)
    Dr.GRPO   Understanding R1-Zero-Like Training, Liu et al. 2025, https://arxiv.org/abs/2503.20783
    RLOO      Back to Basics (Ahmadian et al. 2024), https://arxiv.org/abs/2402.14740;
              Kool et al. 2019 "Buy 4 REINFORCE samples, get a baseline for free"
    DAPO      Yu et al. 2025, https://arxiv.org/abs/2503.14476 (soft overlong punishment, sec. 3.4)
    PSR/NSR   Zhu et al. 2025, "The Surprising Effectiveness of Negative Reinforcement in LLM Reasoning",
              https://arxiv.org/abs/2506.01347 (positive and negative samples weighted separately)
    Δlog p    Huang et al. 2026, "On the Direction of RLVR Updates for LLM Reasoning: Identification and
              Exploitation" (training-time reweighting of advantages towards low-probability tokens)
"""

from __future__ import annotations

from typing import Callable

import torch

from rlvr_core.core.registry import ADVANTAGES, register

__all__ = [
    "AdvantageFn", "register_advantage", "get_advantage", "known_advantages",
    "grpo_advantages", "dr_grpo_advantages", "rloo_advantages",
    "advantages_to_tokens", "overlong_penalty", "lowprob_token_weights", "weight_negative_advantages",
    "DEFAULT_ADV_EPS",
]

# Same epsilon as verl's GRPO estimator. It only matters for groups whose std is tiny but not zero;
# groups with exactly zero spread are handled explicitly (advantage 0), see _group_stats.
DEFAULT_ADV_EPS = 1e-6


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    # Half/bfloat16/int/bool inputs compute in float32; float64 stays float64 (autograd gradcheck needs it).
    return torch.float64 if x.dtype == torch.float64 else torch.float32


# ---- grouping ---------------------------------------------------------------------------------------------

def _flatten_groups(rewards: torch.Tensor, group_size: int | None,
                    group_ids: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(flat rewards (N,), dense group index (N,) in 0..K-1, number of groups K), validated."""
    if rewards.dim() == 2:
        if group_size is not None and group_size != rewards.shape[1]:
            raise ValueError(f"rewards are (B, G) = {tuple(rewards.shape)} but group_size={group_size}")
        if group_ids is not None:
            raise ValueError("group_ids only applies to flat (N,) rewards")
        b, g = rewards.shape
        flat = rewards.reshape(-1)
        index = torch.arange(b, device=rewards.device).repeat_interleave(g)
        return flat, index, b
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be (B, G) or flat (N,), got shape {tuple(rewards.shape)}")
    n = rewards.shape[0]
    if (group_size is None) == (group_ids is None):
        raise ValueError("flat rewards need exactly one of group_size (contiguous groups) or group_ids (ragged)")
    if group_size is not None:
        if group_size < 1 or n % group_size:
            raise ValueError(f"{n} rewards do not split into groups of {group_size}")
        index = torch.arange(n // group_size, device=rewards.device).repeat_interleave(group_size)
        return rewards, index, n // group_size
    if group_ids.shape != (n,):
        raise ValueError(f"group_ids shape {tuple(group_ids.shape)} != rewards shape {(n,)}")
    # Map arbitrary ids to 0..K-1 so scatter works; inverse keeps each sample's group.
    _, index = torch.unique(group_ids.to(rewards.device), return_inverse=True)
    return rewards, index, int(index.max().item()) + 1 if n else 0


def _group_stats(rewards: torch.Tensor, group_size: int | None, group_ids: torch.Tensor | None,
                 min_group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample (reward, group mean, group unbiased std, group count, zero-spread flag), all (N,).

    Two passes (mean, then centred squares) rather than E[r^2] - E[r]^2, which cancels badly in float32.
    """
    flat, index, k = _flatten_groups(rewards, group_size, group_ids)
    r = flat.detach().to(_compute_dtype(flat))
    counts = torch.zeros(k, dtype=r.dtype, device=r.device).index_add_(0, index, torch.ones_like(r))
    if k and int(counts.min().item()) < min_group:
        raise ValueError(f"every group needs at least {min_group} completions; smallest has {int(counts.min())}")
    mean = torch.zeros(k, dtype=r.dtype, device=r.device).index_add_(0, index, r) / counts
    centred = r - mean[index]
    # Unbiased (Bessel, / (n - 1)) std: what torch.std gives by default and what verl and TRL use.
    var = torch.zeros(k, dtype=r.dtype, device=r.device).index_add_(0, index, centred**2) / (counts - 1).clamp(min=1)
    std = var.sqrt()
    # Exactly-equal rewards must give advantage exactly 0: a float mean of identical values can be off by
    # one ulp, and that ulp divided by eps=1e-6 is a spurious, nonzero advantage.
    hi = torch.full((k,), -torch.inf, dtype=r.dtype, device=r.device).scatter_reduce(0, index, r, "amax")
    lo = torch.full((k,), torch.inf, dtype=r.dtype, device=r.device).scatter_reduce(0, index, r, "amin")
    flat_group = hi == lo
    return r, mean[index], std[index], counts[index], flat_group[index]


# ---- registry ---------------------------------------------------------------------------------------------

# fn(rewards, group_size=None, *, group_ids=None, eps=DEFAULT_ADV_EPS) -> advantages, same shape as rewards.
# Each estimator below registers itself (`@register("advantage", name)`); its name is also listed, torch-free, in
# rlvr_core/core/registry.py, so the config checks `grpo.advantage` without importing this module.
AdvantageFn = Callable[..., torch.Tensor]
register_advantage = ADVANTAGES.register  # decorator: @register_advantage("my_estimator")
get_advantage = ADVANTAGES.get
known_advantages = ADVANTAGES.names


# ---- estimators -------------------------------------------------------------------------------------------

@register("advantage", "grpo")
def grpo_advantages(rewards: torch.Tensor, group_size: int | None = None, *,
                    group_ids: torch.Tensor | None = None, eps: float = DEFAULT_ADV_EPS) -> torch.Tensor:
    """GRPO outcome advantage: A_i = (r_i - mean_g(r)) / (std_g(r) + eps).

    std is the *unbiased* group std (divides by G - 1), as torch.std, verl and TRL compute it; the paper
    does not say which. Groups whose rewards are all equal get A = 0 exactly (no signal, no noise).
    rewards: (B, G), or (B*G,) with group_size, or (N,) with group_ids. Every group needs >= 2 samples
    (the unbiased std of one sample is undefined).
    Returns: float32 (float64 for float64 input), the shape of `rewards`, detached.
    """
    r, mean, std, _, flat = _group_stats(rewards, group_size, group_ids, min_group=2)
    adv = torch.where(flat, torch.zeros_like(r), (r - mean) / (std + eps))
    return adv.reshape(rewards.shape)


@register("advantage", "dr_grpo")
def dr_grpo_advantages(rewards: torch.Tensor, group_size: int | None = None, *,
                       group_ids: torch.Tensor | None = None, eps: float = DEFAULT_ADV_EPS) -> torch.Tensor:
    """Dr.GRPO outcome advantage: A_i = r_i - mean_g(r) (no division by the std).

    Dividing by the group std up-weights prompts that are nearly always solved or nearly always failed
    (question-level difficulty bias, Dr.GRPO sec. 3.1); dropping it removes that bias. `eps` is accepted
    for a uniform registry signature and ignored.
    rewards: (B, G), or (B*G,) with group_size, or (N,) with group_ids; groups of >= 2.
    Returns: float32 (float64 for float64 input), the shape of `rewards`, detached.
    """
    r, mean, _, _, flat = _group_stats(rewards, group_size, group_ids, min_group=2)
    adv = torch.where(flat, torch.zeros_like(r), r - mean)
    return adv.reshape(rewards.shape)


@register("advantage", "rloo")
def rloo_advantages(rewards: torch.Tensor, group_size: int | None = None, *,
                    group_ids: torch.Tensor | None = None, eps: float = DEFAULT_ADV_EPS) -> torch.Tensor:
    """RLOO advantage: A_i = r_i - (1 / (G - 1)) * sum_{j != i} r_j (leave-one-out baseline).

    The baseline excludes the sample itself, so it is independent of r_i and the estimator is unbiased.
    Algebraically A_i = G / (G - 1) * (r_i - mean_g(r)), which is how it is computed (no O(G^2) loop).
    `eps` is accepted for a uniform registry signature and ignored.
    rewards: (B, G), or (B*G,) with group_size, or (N,) with group_ids; groups of >= 2.
    Returns: float32 (float64 for float64 input), the shape of `rewards`, detached.
    """
    r, mean, _, count, flat = _group_stats(rewards, group_size, group_ids, min_group=2)
    adv = torch.where(flat, torch.zeros_like(r), count / (count - 1) * (r - mean))
    return adv.reshape(rewards.shape)


# ---- sequence -> token --------------------------------------------------------------------------------------

def advantages_to_tokens(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Broadcast per-sequence advantages to the tokens of each response: A[b, t] = A[b] * mask[b, t].

    advantages: (B,) (or (B, G), flattened row-major to B*G sequences, the order of the flat layout).
    mask: (B, T) response mask, bool or 0/1, built from lengths (see losses.mask_from_lengths).
    Returns: (B, T) float32, zero on padding.
    """
    adv = advantages.reshape(-1)
    if adv.shape[0] != mask.shape[0] or mask.dim() != 2:
        raise ValueError(f"advantages ({adv.shape[0]} sequences) do not match mask {tuple(mask.shape)}")
    adv = adv.detach().to(_compute_dtype(adv))
    return torch.where(mask.bool(), adv[:, None], torch.zeros((), dtype=adv.dtype, device=adv.device))


# ---- reward shaping (DAPO) ----------------------------------------------------------------------------------

def overlong_penalty(lengths: torch.Tensor, max_len: int, cache_len: int, factor: float = 1.0) -> torch.Tensor:
    """DAPO soft overlong punishment, added to the task reward (DAPO sec. 3.4, "overlong reward shaping"):

        R(L) = 0                                   if L <= max_len - cache_len
        R(L) = ((max_len - cache_len) - L) / cache_len   if max_len - cache_len < L <= max_len
        R(L) = -1                                  if L > max_len
    times `factor` (1.0 in the paper). Piecewise linear and continuous: 0 at the start of the cache
    window, -1 at max_len. Why soft: a hard -1 for every truncated answer punishes sound reasoning that
    happened to be long, which DAPO found adds reward noise.

    lengths: (N,) int response lengths in tokens. max_len: the generation cap (DAPO: 20480);
    cache_len: the width of the penalty window (DAPO: 4096).
    Returns: (N,) float32 in [-factor, 0].
    """
    if not 0 < cache_len <= max_len:
        raise ValueError(f"need 0 < cache_len <= max_len, got cache_len={cache_len}, max_len={max_len}")
    if factor < 0:
        raise ValueError(f"factor must be >= 0, got {factor}")
    L = lengths.to(torch.float32)
    start = float(max_len - cache_len)
    ramp = (start - L) / cache_len
    pen = torch.where(L <= start, torch.zeros_like(L), torch.where(L <= max_len, ramp, -torch.ones_like(L)))
    return pen * factor


# ---- Δlog p training-time reweighting -----------------------------------------------------------------------

def lowprob_token_weights(old_logp: torch.Tensor, c: float) -> torch.Tensor:
    """Per-token advantage weights w = 1 + c - c * pi_old(token), pi_old = exp(old_logp).

    From the Δlog p paper (training-time reweighting): tokens whose log-probability RLVR raises most
    are the low-probability ones, so their advantages are scaled up. w lies in [1, 1 + c]: 1 for a
    token the old policy was sure of, 1 + c for a very unlikely one. c = 0 gives exactly 1 (identity).
    Uses the *old* (behaviour) policy, so the weight is a constant of the update (no gradient).
    Multiply token advantages by w before the clipped loss; for w > 0 that is the same as scaling each
    token's clipped objective by w, so clipping behaves as without reweighting.

    old_logp: (B, T) log-probs of the sampled tokens under the sampling policy; any float dtype.
    Returns: (B, T) float32 (float64 for float64 input). Padding positions get some weight in [1, 1+c];
    the loss mask removes them.
    """
    if c < 0:
        raise ValueError(f"reweighting strength c must be >= 0, got {c}")
    lp = old_logp.detach().to(_compute_dtype(old_logp))
    # clamp: padding may hold garbage (e.g. +inf); probabilities above 1 are not meaningful anyway.
    p = lp.clamp(max=0.0).exp().nan_to_num(nan=0.0)
    return 1.0 + c - c * p


# ---- positive / negative sample weighting -------------------------------------------------------------------

def weight_negative_advantages(advantages: torch.Tensor, weight: float) -> torch.Tensor:
    """Advantages with every negative entry multiplied by `weight` (positive entries unchanged).

    The policy gradient splits into positive-sample reinforcement (raise the log-probability of
    completions better than their group) and negative-sample reinforcement (lower the worse ones); Zhu
    et al. 2025 (PSR/NSR, https://arxiv.org/abs/2506.01347) study the two apart. weight = 1 is the
    estimator unchanged (bit for bit), 0 trains on the better-than-baseline completions only (PSR, which
    sharpens the policy towards the answers it already finds: greedy accuracy rises, pass@k at large k
    can fall), values in between mix the two. Lowering the probability of a sampled token pushes mass
    to *every* other token, which is what makes large negative updates of a small model erratic; the
    positive part only concentrates mass on tokens that were sampled and rewarded.

    advantages: any shape, any float dtype. Returns the same shape and dtype, no gradient.
    """
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"negative advantage weight must be in [0, 1], got {weight}")
    a = advantages.detach()
    if weight == 1.0:
        return a
    return torch.where(a < 0, a * weight, a)
