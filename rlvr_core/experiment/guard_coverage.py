"""Which guards of docs/guards.md protect a run, computed from its resolved config.

`guard_coverage(cfg)` maps every guard id (`GUARDS`, the rows of docs/guards.md in order) to either
"active" (optionally "active: <how>", where the way it works depends on the settings) or
"needs <what>", the setting that would switch it on. It goes into the train stage's and the pipeline
run's summary (`guard_coverage`), so a run shows what it was guarded against instead of leaving it to
whoever reads the config. Pure: no torch, no Prefect.
"""

from __future__ import annotations

from typing import Callable

from rlvr_core.data.templates import get_template
from rlvr_core.experiment.config import ExperimentConfig
from rlvr_core.experiment.guards import (GUARD_COLLAPSE, GUARD_ENTROPY, GUARD_KL_EXPLOSION, GUARD_REWARD_HACKING,
                                         HealthConfig, health_config)

__all__ = ["GUARDS", "guard_coverage", "ACTIVE", "NEEDS"]

ACTIVE, NEEDS = "active", "needs "

# Every guard of docs/guards.md, in the table's order (tests/test_guard_docs.py checks the two agree).
GUARDS = ("G-logprob-temp", "G-pad-mask", "G-fixed-seed", "G-chat-template", "G-verifier-format",
          "G-prompt-mismatch", "G-id-mismatch", "G-partial-batch", "G-verifier-hang", "G-verifier-error",
          "G-truncation", "G-stop-seq", "G-stale-buffer", "G-onpolicy-ratio", "G-kl-explosion", "G-collapse",
          "G-entropy", "G-oom", "G-lost-ckpt", "G-eval-parallel", "G-no-eval", "G-small-eval", "G-reward-hacking",
          "G-weight-push", "G-regression", "G-correction-mask")

# Guards that watch GRPO training: without training there is nothing for them to watch. (G-verifier-hang's
# pool guards the pass-rate stage too.)
_TRAINING = {"G-logprob-temp", "G-fixed-seed", "G-verifier-format", "G-stale-buffer",
             "G-onpolicy-ratio", "G-kl-explosion", "G-collapse", "G-entropy", "G-lost-ckpt", "G-no-eval",
             "G-reward-hacking", "G-partial-batch", "G-weight-push", "G-regression", "G-correction-mask"}


def _enabled(health: HealthConfig, guard: str) -> str | None:
    """None when the run-level detector runs, else what it needs."""
    return None if guard in health.enabled else f"{NEEDS}{guard} in grpo.guards.health.enabled"


def _kl_explosion(cfg: ExperimentConfig, health: HealthConfig) -> str:
    g = cfg.grpo
    if g.beta > 0:
        return ACTIVE
    if g.drift_active():
        return (f"{ACTIVE}: beta 0, the drift signal every {g.guards.drift_every} steps feeds the episode detector; "
                "the per-step kl_spike_max flag needs grpo.beta > 0")
    return f"{NEEDS}grpo.beta > 0 or grpo.guards.drift_every > 0 (no reference model and no drift signal)"


def _entropy(cfg: ExperimentConfig, health: HealthConfig) -> str:
    g = cfg.grpo
    if g.beta > 0 or g.drift_active():
        return ACTIVE
    return f"{NEEDS}grpo.beta > 0 or grpo.guards.drift_every > 0 for its stop (the entropy-floor flag is active)"


def _no_eval(cfg: ExperimentConfig, health: HealthConfig) -> str:
    every, n = cfg.grpo.eval_interval(), cfg.grpo.eval_max_problems
    if every:
        return f"{ACTIVE}: every {every} steps on {f'at most {n}' if n else 'all'} held-out problems"
    return (f"{NEEDS}grpo.eval_every > 0 (or auto with grpo.steps > {cfg.grpo.AUTO_EVAL_MIN_STEPS}); "
            "now only the last step is evaluated")


def _reward_hacking(cfg: ExperimentConfig, health: HealthConfig) -> str:
    every = cfg.grpo.eval_interval()
    # Against the first eval point it needs that point plus `confirm_evals` more (the final eval counts).
    points = cfg.grpo.steps // every + (cfg.grpo.steps % every > 0) if every else 1
    need = health.reward_hacking.confirm_evals + 1
    if points < need:
        return f"{NEEDS}at least {need} eval points during training (grpo.eval_every; now {points})"
    return ACTIVE


def _verifier_hang(cfg: ExperimentConfig, health: HealthConfig) -> str:
    if cfg.reward.max_timeout_share >= 1:
        return f"{NEEDS}reward.max_timeout_share < 1 (a share above 1 can never be exceeded)"
    return ACTIVE


def _id_mismatch(cfg: ExperimentConfig, health: HealthConfig) -> str:
    tol = cfg.curriculum.id_tolerance
    return ACTIVE if tol == 0 else f"{ACTIVE}: up to {tol:g} unmatched ids tolerated (curriculum.id_tolerance)"


def _weight_push(cfg: ExperimentConfig, health: HealthConfig) -> str:
    if cfg.sampling.engine == "vllm-server":
        return ACTIVE
    return (f"{ACTIVE}: nothing to push (engine {cfg.sampling.engine} samples in the trainer's process; a missed "
            "in-process sync shows as G-onpolicy-ratio)")


def _stop_seq(cfg: ExperimentConfig, health: HealthConfig) -> str:
    t = get_template(cfg.prompt.template)
    if t.kind == "base" and not t.stop:
        return f"{NEEDS}a base prompt template with stop sequences ({t.id} has none)"
    return ACTIVE


def _regression(cfg: ExperimentConfig, health: HealthConfig) -> str:
    return (f"{ACTIVE}: trained vs base on the same held-out problems, when the run evaluates its base model too "
            "(`rlvr demo`; the pipeline flow with eval_base)")


def _correction_mask(cfg: ExperimentConfig, health: HealthConfig) -> str:
    g = cfg.grpo
    if g.tis_cap is not None and g.tis_mode.endswith("_mask"):
        return ACTIVE
    return (f"{ACTIVE}: nothing rejects tokens in this run (only grpo.tis_mode token_mask / sequence_mask with "
            "grpo.tis_cap do)")


_RULES: dict[str, Callable[[ExperimentConfig, HealthConfig], str]] = {
    "G-kl-explosion": _kl_explosion, "G-entropy": _entropy, "G-no-eval": _no_eval,
    "G-reward-hacking": _reward_hacking, "G-verifier-hang": _verifier_hang, "G-id-mismatch": _id_mismatch,
    "G-stop-seq": _stop_seq, "G-weight-push": _weight_push, "G-regression": _regression,
    "G-correction-mask": _correction_mask,
}
_DETECTOR_OF = {GUARD_COLLAPSE: GUARD_COLLAPSE, GUARD_ENTROPY: GUARD_ENTROPY,
                GUARD_REWARD_HACKING: GUARD_REWARD_HACKING, GUARD_KL_EXPLOSION: GUARD_KL_EXPLOSION}


def guard_coverage(cfg: ExperimentConfig) -> dict[str, str]:
    """{guard id: "active" | "active: <how>" | "needs <what>"} for every guard of docs/guards.md."""
    health = health_config(cfg.grpo.guards.health)
    out: dict[str, str] = {}
    for g in GUARDS:
        if g in _TRAINING and not cfg.grpo.enabled:
            out[g] = f"{NEEDS}grpo.enabled (no training in this run)"
            continue
        off = _enabled(health, _DETECTOR_OF[g]) if g in _DETECTOR_OF else None
        rule = _RULES.get(g)
        out[g] = off or (rule(cfg, health) if rule else ACTIVE)
    return out
