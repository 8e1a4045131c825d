"""Which guards of docs/guards.md protect a run, computed from its resolved config.

`guard_coverage(cfg)` maps every guard id (`GUARDS`, the rows of docs/guards.md in order) to one of
"active" (optionally "active: <how>", where the way it works depends on the settings),
"needs <what>", the setting that would switch it on, or
"off: <setting> = <value> (<why>)", a value that switches it off: a share limit no share can pass, a window or a
first judged step past the run's last step, more required signals than exist, the guard left out of `enabled`.
"Active" is derived from each guard's effective thresholds and windows against the run's length and settings, so
a guard that can never fire in this run is never listed as active. It goes into the train stage's and the
pipeline run's summary (`guard_coverage`), and `unguarded_line` is the one terminal line a run prints at start.
Pure: no torch, no Prefect.
"""

from __future__ import annotations

from typing import Callable

from rlvr_core.data.templates import get_template
from rlvr_core.experiment.config import ExperimentConfig
from rlvr_core.experiment.guards import (GUARD_COLLAPSE, GUARD_ENTROPY, GUARD_KL_EXPLOSION, GUARD_NO_SIGNAL,
                                         GUARD_REWARD_HACKING, HealthConfig)

__all__ = ["GUARDS", "guard_coverage", "unguarded_line", "ACTIVE", "NEEDS", "OFF"]

ACTIVE, NEEDS, OFF = "active", "needs ", "off: "
COLLAPSE_SIGNALS = 7  # grad_norm, reward, completion_len, truncation, entropy, ratio, repetition (guards.py)

# Every guard of docs/guards.md, in the table's order (tests/test_guard_docs.py checks the two agree).
GUARDS = ("G-logprob-temp", "G-pad-mask", "G-fixed-seed", "G-chat-template", "G-verifier-format", "G-no-signal",
          "G-prompt-mismatch", "G-id-mismatch", "G-partial-batch", "G-verifier-hang", "G-verifier-error",
          "G-truncation", "G-stop-seq", "G-stale-buffer", "G-onpolicy-ratio", "G-kl-explosion", "G-collapse",
          "G-entropy", "G-oom", "G-lost-ckpt", "G-eval-parallel", "G-no-eval", "G-small-eval", "G-reward-hacking",
          "G-weight-push", "G-regression", "G-correction-mask", "G-teacher-kl", "G-tito-context", "G-tito-mask", "G-tool-errors",
          "G-turn-budget", "G-rerender-drift")

# Guards that watch GRPO training: without training there is nothing for them to watch. (G-verifier-hang's
# pool guards the pass-rate stage too.)
_TRAINING = {"G-logprob-temp", "G-fixed-seed", "G-verifier-format", "G-no-signal", "G-stale-buffer",
             "G-onpolicy-ratio", "G-kl-explosion", "G-collapse", "G-entropy", "G-lost-ckpt", "G-no-eval",
             "G-reward-hacking", "G-partial-batch", "G-weight-push", "G-regression", "G-correction-mask",
             "G-teacher-kl", "G-tool-errors", "G-turn-budget", "G-rerender-drift"}


def _off(setting: str, value: object, why: str) -> str:
    return f"{OFF}{setting} = {value:g} ({why})" if isinstance(value, float) else f"{OFF}{setting} = {value} ({why})"


def _enabled(health: HealthConfig, guard: str) -> str | None:
    """None when the run-level detector runs, else why not (left out of `enabled`)."""
    if guard in health.enabled:
        return None
    return _off("grpo.guards.health.enabled", list(health.enabled), f"{guard} left out")


def _past_end(cfg: ExperimentConfig, setting: str, value: int, first: int) -> str | None:
    """Off when the guard's first judged step (`first`) lies past the run's last step."""
    steps = cfg.grpo.steps
    return _off(setting, value, f"first judged at step {first}, after the run's {steps} steps") if first > steps else None


def _kl_explosion(cfg: ExperimentConfig, health: HealthConfig) -> str:
    g, k = cfg.grpo, health.kl_explosion
    off = _past_end(cfg, "grpo.guards.health.kl_explosion.window", k.window, k.window)
    if off:  # the per-step flag still runs with a reference
        return off if g.beta <= 0 else f"{ACTIVE}: the per-step kl_spike_max flag only ({off.removeprefix(OFF)})"
    if g.beta > 0:
        return ACTIVE
    if g.drift_active():
        return (f"{ACTIVE}: beta 0, the drift signal every {g.guards.drift_every} steps feeds the episode detector; "
                "the per-step kl_spike_max flag needs grpo.beta > 0")
    return f"{NEEDS}grpo.beta > 0 or grpo.guards.drift_every > 0 (no reference model and no drift signal)"


def _collapse(cfg: ExperimentConfig, health: HealthConfig) -> str:
    c = health.collapse
    if c.min_signals > COLLAPSE_SIGNALS:
        return _off("grpo.guards.health.collapse.min_signals", c.min_signals,
                    f"more than the {COLLAPSE_SIGNALS} signals it watches")
    off = _past_end(cfg, "grpo.guards.health.collapse.window", c.window, c.window)
    if off:
        return off
    late = c.baseline_steps + c.window
    if late > cfg.grpo.steps:
        return (f"{ACTIVE}: reward, truncation and length against the base model only (grad norm, entropy, ratio "
                f"and repetition first judged at step {late}, after the run's {cfg.grpo.steps} steps)")
    return ACTIVE


def _no_signal(cfg: ExperimentConfig, health: HealthConfig) -> str:
    n = health.no_signal
    if n.min_dead_steps > n.window:
        return _off("grpo.guards.health.no_signal.min_dead_steps", n.min_dead_steps,
                    f"more than its window of {n.window} steps holds")
    off = _past_end(cfg, "grpo.guards.health.no_signal.min_dead_steps", n.min_dead_steps, n.min_dead_steps)
    if off:
        return f"{ACTIVE}: the pass-rate check before training only ({off.removeprefix(OFF)})"
    return ACTIVE if n.serious else f"{ACTIVE}: a flag, not a stop (grpo.guards.health.no_signal.serious false)"


def _entropy(cfg: ExperimentConfig, health: HealthConfig) -> str:
    g, e = cfg.grpo, health.entropy
    off = _past_end(cfg, "grpo.guards.health.entropy.window + baseline_steps", e.window + e.baseline_steps,
                    e.window + e.baseline_steps)
    if off:
        return off
    if g.beta > 0 or g.drift_active():
        return ACTIVE
    return f"{NEEDS}grpo.beta > 0 or grpo.guards.drift_every > 0 for its stop (the entropy-floor flag is active)"


def _no_eval(cfg: ExperimentConfig, health: HealthConfig) -> str:
    every, n = cfg.grpo.eval_interval(), cfg.grpo.eval_max_problems
    if every and every >= cfg.grpo.steps:
        return _off("grpo.eval_every", every, f"not shorter than the run's {cfg.grpo.steps} steps: only the last step "
                                              "is evaluated")
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
        return _off("reward.max_timeout_share", cfg.reward.max_timeout_share, "no share can exceed 1")
    return ACTIVE


def _verifier_error(cfg: ExperimentConfig, health: HealthConfig) -> str:
    train, ev = cfg.reward.max_error_share, cfg.eval.max_verifier_error_share
    train_on = train < 1 and cfg.grpo.enabled
    if train_on and ev < 1:
        return ACTIVE
    if train_on:
        return f"{ACTIVE}: training steps only ({_off('eval.max_verifier_error_share', ev, 'no share can exceed 1')})"
    if ev < 1:
        return f"{ACTIVE}: evaluations only" + (f" ({_off('reward.max_error_share', train, 'no share can exceed 1')})"
                                                  if cfg.grpo.enabled else "")
    return _off("reward.max_error_share and eval.max_verifier_error_share", f"{train:g} and {ev:g}",
                "no share can exceed 1")


def _truncation(cfg: ExperimentConfig, health: HealthConfig) -> str:
    if cfg.eval.max_truncation_share >= 1:
        return _off("eval.max_truncation_share", cfg.eval.max_truncation_share, "no share can exceed 1; the share "
                    "is still recorded per evaluation")
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


def _teacher_kl(cfg: ExperimentConfig, health: HealthConfig) -> str:
    if cfg.grpo.distill_teacher is not None:
        return ACTIVE
    return f"{ACTIVE}: no distillation teacher in this run (only grpo.distill_teacher has one)"


def _environment(setting: str | None = None) -> Callable[[ExperimentConfig, HealthConfig], str]:
    """A multi-turn environment's guard: nothing to check on single-turn rollouts; off at a share limit of 1."""
    def rule(cfg: ExperimentConfig, health: HealthConfig) -> str:
        env = cfg.environment
        if not env.multi_turn:
            return f"{ACTIVE}: nothing to check (single-turn rollouts; environment.name: tools runs multi-turn)"
        if setting is not None and getattr(env, setting) >= 1:
            return _off(f"environment.{setting}", getattr(env, setting), "no share can exceed 1")
        return ACTIVE
    return rule


_RULES: dict[str, Callable[[ExperimentConfig, HealthConfig], str]] = {
    "G-kl-explosion": _kl_explosion, "G-entropy": _entropy, "G-no-eval": _no_eval, "G-collapse": _collapse,
    "G-no-signal": _no_signal, "G-verifier-error": _verifier_error, "G-truncation": _truncation,
    "G-reward-hacking": _reward_hacking, "G-verifier-hang": _verifier_hang, "G-id-mismatch": _id_mismatch,
    "G-stop-seq": _stop_seq, "G-weight-push": _weight_push, "G-regression": _regression,
    "G-correction-mask": _correction_mask, "G-teacher-kl": _teacher_kl, "G-tito-context": _environment(), "G-tito-mask": _environment(),
    "G-tool-errors": _environment("max_tool_error_share"), "G-turn-budget": _environment("max_cut_share"),
    "G-rerender-drift": _environment("max_rerender_drift"),
}
_DETECTOR_OF = {GUARD_COLLAPSE: GUARD_COLLAPSE, GUARD_ENTROPY: GUARD_ENTROPY, GUARD_NO_SIGNAL: GUARD_NO_SIGNAL,
                GUARD_REWARD_HACKING: GUARD_REWARD_HACKING, GUARD_KL_EXPLOSION: GUARD_KL_EXPLOSION}


def guard_coverage(cfg: ExperimentConfig) -> dict[str, str]:
    """{guard id: "active" | "active: <how>" | "needs <what>" | "off: <setting> = <value> (<why>)"} for every guard
    of docs/guards.md."""
    health = cfg.grpo.guards.health
    out: dict[str, str] = {}
    for g in GUARDS:
        if g in _TRAINING and not cfg.grpo.enabled:
            out[g] = f"{NEEDS}grpo.enabled (no training in this run)"
            continue
        off = _enabled(health, _DETECTOR_OF[g]) if g in _DETECTOR_OF else None
        rule = _RULES.get(g)
        out[g] = off or (rule(cfg, health) if rule else ACTIVE)
    return out


def unguarded_line(coverage: dict[str, str]) -> str | None:
    """The one line a run prints at start: every guard that is not active, with the setting that decides it; None
    when every guard is active."""
    off = [f"{g} ({v.removeprefix(OFF) if v.startswith(OFF) else v})" for g, v in coverage.items()
           if not v.startswith(ACTIVE)]
    return ("not guarded in this run: " + "; ".join(off)) if off else None
