"""GRPO algorithms index: every estimator, loss, aggregation and KL estimator, by registered name.

The trainer (elsewhere) resolves config values through these registries, so a YAML value maps to one
function and an unknown value fails before any expensive work:

    grpo.advantage      -> get_advantage(name)       "grpo", "dr_grpo", "rloo"            (advantages.py)
    grpo.kl_estimator   -> get_kl_estimator(name)    "k1", "k2", "k3"                     (kl.py)
    grpo.policy_loss    -> get_policy_loss(name)     "ppo_clip" (losses.py), "gspo", "luspo",
                                                     "cispo", "sapo"                      (policy_losses.py)
    loss aggregation    -> get_loss_agg(name)        "token-mean", "seq-mean-token-mean",
                                                     "seq-mean-token-sum", "seq-mean-token-sum-norm" (losses.py)

Each function registers itself where it lives (`@register(kind, name)`); the built-in names are also listed,
torch-free, in rlvr_core/core/registry.py, which the config checks names against.

Plus the unregistered pieces: advantages_to_tokens, overlong_penalty, lowprob_token_weights,
weight_negative_advantages (advantages.py), grpo_loss, mask_from_lengths, truncated_is_weights (losses.py),
and the sampling strategies (sampling_strategies.py). docs/grpo_algorithms.md has the formulas, papers and
defaults. The trainer uses overlong_penalty (GRPOConfig.overlong_buffer_len), lowprob_token_weights through
grpo_loss's lowprob_c (GRPOConfig.dlogp_reweight_c), filter_zero_variance_groups
(GRPOConfig.dynamic_sampling) and correction_weights (rollout_correction.py) with grpo_loss's is_weights
(GRPOConfig.tis_cap, tis_mode, tis_min, tis_seq_ratio);
docs/grpo_training.md, "Options", says how.
This module only re-exports; it holds no logic.
"""

from __future__ import annotations

from rlvr_core.grpo.advantages import (DEFAULT_ADV_EPS, advantages_to_tokens, dr_grpo_advantages, get_advantage,
                                       grpo_advantages, known_advantages, lowprob_token_weights, overlong_penalty,
                                       register_advantage, rloo_advantages, weight_negative_advantages)
from rlvr_core.grpo.kl import (get_kl_estimator, kl_k1, kl_k2, kl_k3, known_kl_estimators, register_kl_estimator,
                               token_kl)
from rlvr_core.grpo.losses import (aggregate_loss, get_loss_agg, get_policy_loss, grpo_loss, known_loss_aggs,
                                   known_policy_losses, mask_from_lengths, ppo_clip_loss, register_loss_agg,
                                   register_policy_loss, truncated_is_weights)
from rlvr_core.grpo.policy_losses import cispo_loss, gspo_loss, luspo_loss, sapo_loss, sequence_log_ratio
from rlvr_core.grpo.rollout_correction import correction_weights
from rlvr_core.grpo.sampling_strategies import (AdaptiveSamplingState, BoundedBuffer, BufferClosed,
                                                DynamicSamplingResult, filter_zero_variance_groups)

__all__ = [
    "DEFAULT_ADV_EPS", "advantages_to_tokens", "dr_grpo_advantages", "get_advantage", "grpo_advantages",
    "known_advantages", "lowprob_token_weights", "overlong_penalty", "register_advantage", "rloo_advantages",
    "weight_negative_advantages",
    "get_kl_estimator", "kl_k1", "kl_k2", "kl_k3", "known_kl_estimators", "register_kl_estimator", "token_kl",
    "aggregate_loss", "get_loss_agg", "get_policy_loss", "grpo_loss", "known_loss_aggs",
    "known_policy_losses", "mask_from_lengths", "ppo_clip_loss", "register_loss_agg", "register_policy_loss",
    "truncated_is_weights", "cispo_loss", "gspo_loss", "luspo_loss", "sapo_loss", "sequence_log_ratio",
    "correction_weights",
    "AdaptiveSamplingState", "BoundedBuffer", "BufferClosed", "DynamicSamplingResult",
    "filter_zero_variance_groups", "registries",
]


def registries() -> dict[str, list[str]]:
    """Every registry and its names, e.g. for `rlvr` help text and the docs-coverage test."""
    return {"advantage": known_advantages(), "policy_loss": known_policy_losses(),
            "loss_agg": known_loss_aggs(), "kl_estimator": known_kl_estimators()}
