"""Training-health detectors over the GRPO trainer's step rows (BUGZOO G-collapse, G-entropy,
G-reward-hacking, G-kl-explosion, G-no-signal). Pure Python: no torch, no Prefect, no I/O. One idea, kept in one file
past 600 lines on purpose: the detectors, their thresholds and the monitor that runs them read as one table. The
thresholds are the typed config section `grpo.guards.health` (`HealthConfig`, one pydantic model per detector, with
help text and bounds), checked when the experiment config loads.

Input: the trainer's step rows, a list of dicts in step order with the columns documented in
docs/grpo_training.md (step, reward_mean, grad_norm, completion_len_mean, truncation_share, entropy,
ratio_max, ratio_min, kl_ref_mean, kl_ref_max, unique_frac_mean, `eval/<name>` on evaluated steps, ...).
Missing keys, None and NaN are "unknown" and never fire anything (kl_ref_* are NaN without a reference
model; `eval/*` are None on steps that were not evaluated when the rows come back from Parquet).
+inf counts as a blow-up where a blow-up is what is being detected (a grad norm of inf).

Output: `Firing(guard_id, step, serious, reason, evidence, key)`. A serious firing means "stop the run"
(the trainer raises GuardError and the run is tagged `collapsed`); the others are flags (`health/<id>`).

Episodes, and calling after every step
--------------------------------------
Every detector is a scan over the rows in order. At each step it evaluates a condition on the rows up to
and including that step (never later ones), and it fires once at the first step of an *episode*: a
stretch of steps where the condition holds. The episode ends only after the condition has been false for
`rearm_steps` consecutive steps (default: the trailing window; for G-reward-hacking, `rearm_evals`
consecutive eval points), so a condition that flickers around its threshold fires once, not every
other step. Episodes are per (guard, key): G-reward-hacking keys them by eval name, and G-entropy has a
second key, "kl", for the one serious escalation when the KL to the reference explodes inside an episode
of low entropy that was flagged earlier. Because a firing at step s depends only on rows with step <= s,
the scan is *causal*:

  * `check_health(rows, cfg)` is idempotent: it returns every firing over the whole history, the same list
    whenever it is called with the same rows, and a prefix of the rows gives a prefix of the firings.
  * Called after every step with all rows so far, pass the firings you already have as `previous` and it
    returns only the new ones (always at the newest step). The same guard never fires twice for the same
    episode. After a resume, `check_health(restored_rows, cfg)` rebuilds `previous`.
  * `HealthMonitor` gives the same firings incrementally in O(window) per step, for very long runs
    (`check_health` rescans everything: ~O(steps) per call).

Defaults and why they are what they are: docs/guards_training.md.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any, Iterable, Mapping, Sequence

from pydantic import BeforeValidator, Field, SerializerFunctionWrapHandler, field_validator, model_serializer

from rlvr_core.experiment.config_base import Strict
from rlvr_core.experiment.no_signal import NEAR_GREEDY, REPEATED_UNIQUE, no_signal_cause, window_facts

__all__ = [
    "GUARD_COLLAPSE", "GUARD_ENTROPY", "GUARD_REWARD_HACKING", "GUARD_KL_EXPLOSION", "GUARD_NO_SIGNAL", "GUARD_IDS",
    "Firing", "CollapseConfig", "EntropyConfig", "RewardHackingConfig", "KLExplosionConfig", "NoSignalConfig",
    "HealthConfig", "detect_collapse", "detect_entropy", "detect_reward_hacking", "detect_kl_explosion",
    "detect_no_signal", "check_health",
    "HealthMonitor", "health_flags", "firing_dict", "GuardError", "RunStopped",
]

GUARD_COLLAPSE = "G-collapse"
GUARD_ENTROPY = "G-entropy"
GUARD_REWARD_HACKING = "G-reward-hacking"
GUARD_KL_EXPLOSION = "G-kl-explosion"
GUARD_NO_SIGNAL = "G-no-signal"
GUARD_IDS = (GUARD_COLLAPSE, GUARD_ENTROPY, GUARD_REWARD_HACKING, GUARD_KL_EXPLOSION, GUARD_NO_SIGNAL)


class GuardError(RuntimeError):
    """A guard that stops the run (as opposed to guards that only count and flag). Raised by the trainer.
    `guard`: the guard's id (G-collapse, G-logprob-temp, ...); `step`: the training step it stopped at (None when
    it stopped at no step)."""

    def __init__(self, message: str, *, guard: str = "", step: int | None = None):
        super().__init__(message)
        self.guard, self.step = guard, step

    def __reduce__(self):  # keeps the fields through pickling (Prefect's results)
        return _rebuild, (type(self), str(self), {"guard": self.guard, "step": self.step})


class RunStopped(RuntimeError):
    """A guard stopped a pipeline run, and the run was recorded: raised by the pipeline flow from the stage's own
    error (its `__cause__`), with that error's message. `record`: the stopped run's summary (`stopped_by`,
    `stopped_at_step`, `reasons`, `report`, `mlflow_run_url`, `train_folder`); `guard`, `step`: its first guard
    and the step."""

    def __init__(self, message: str, *, record: Mapping[str, Any]):
        super().__init__(message)
        self.record = dict(record)
        self.guard: str = self.record["stopped_by"][0]
        self.step: int | None = self.record.get("stopped_at_step")

    def __reduce__(self):
        return _rebuild, (type(self), str(self), {"record": self.record})


def _rebuild(cls: type, message: str, fields: dict[str, Any]) -> BaseException:
    return cls(message, **fields)


@dataclass(frozen=True)
class Firing:
    """One guard firing: the first step of an episode."""

    guard_id: str
    step: int
    serious: bool                      # True: stop the run (GuardError, tag `collapsed`); False: a flag
    reason: str                        # human sentence naming the evidence and its values
    evidence: dict[str, Any] = field(default_factory=dict)
    key: str = ""                      # episode key: eval name (G-reward-hacking), "kl" (G-entropy escalation)

    @property
    def ident(self) -> tuple[str, str, int]:
        return (self.guard_id, self.key, self.step)


# ------------------------------------------------------------------------------------------- configs
def _number(v: Any) -> Any:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"expected float, got {v!r}")
    return v


# A threshold kept as the config wrote it: an int stays an int, so the resolved config and the training key hold
# `8` as they did before the settings were typed (not `8.0`, another hash); a bool or a string is refused.
Number = Annotated[int | float, BeforeValidator(_number)]
Count = Annotated[int, Field(strict=True)]    # a bool or 5.0 is refused
Flag = Annotated[bool, Field(strict=True)]    # 1 or "yes" is refused


class _AsGiven(Strict):
    """Settings of `grpo.guards.health`: the detectors read every setting (defaults filled in), while the resolved
    config and the training key hold only the settings the config gave, as written (unset = the defaults), the form
    they always had, so every earlier run keeps its key."""

    @model_serializer(mode="wrap")
    def _as_given(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if k in self.model_fields_set}


class CollapseConfig(_AsGiven):
    """G-collapse: at least `min_signals` of the signals below over the trailing `window` steps.

    Two kinds of baseline. The base model's own numbers on the prompts each step drew (the step row's
    `base/reward_mean`, `base/truncation_share`, `base/completion_len_mean`, from the pass-rate table measured
    before training) are the reward, truncation and length baselines when present: those signals are evaluated
    from step `window` on, so a run that departs from its base from the first step is stopped within its first
    window. The other baselines (grad norm, entropy, unique share: no base measurement) are medians over the
    run's first `baseline_steps` steps and join from step `baseline_steps + window` on, so their window never
    overlaps their baseline. Without base columns every baseline is the run's own first steps.
    """

    window: Count = Field(5, ge=1, description="trailing steps each signal is judged over")
    baseline_steps: Count = Field(5, ge=1, description="the run's first steps whose medians are the baselines "
                                  "without a base-model measurement (grad norm, entropy, unique share)")
    min_signals: Count = Field(2, ge=1, description="signals that must hold together (more than the 7 watched: off)")
    serious: Flag = Field(True, description="true: a firing stops the run; false: a flag")
    rearm_steps: Count | None = Field(None, ge=1, description="steps the condition must be false before a new "
                                      "episode can fire; None = window")
    grad_norm_factor: Number = Field(5.0, gt=0, description="grad norm (pre-clip): window max >= this x the baseline "
                                     "median (inf counts). Healthy runs stay <= 2.4x")
    reward_rel_floor: Number = Field(0.25, ge=0, description="reward: window median <= this x the reference, once "
                                     "the reference is >= reward_peak_min; reference: the larger of the peak window "
                                     "median so far and the base model's expected reward on the window's prompts")
    reward_peak_min: Number = Field(0.05, ge=0, description="reward: the reference that must be reached first")
    len_abs_floor: Number = Field(2.0, ge=0, description="completion length (median column if present, else mean): "
                                  "window median <= this many tokens, or <= len_rel_floor x the baseline")
    len_rel_floor: Number = Field(0.4, ge=0, description="completion length: relative floor (see len_abs_floor)")
    truncation_share_max: Number = Field(0.9, ge=0, le=1, description="all truncated: window median truncation "
                                         "share >= this, when the baseline was <= truncation_baseline_max")
    truncation_baseline_max: Number = Field(0.5, ge=0, le=1, description="all truncated: the baseline truncation "
                                            "share at or under which the signal is judged")
    entropy_abs_floor: Number = Field(0.03, ge=0, description="entropy: window median <= this, or <= "
                                      "entropy_rel_floor x the baseline")
    entropy_rel_floor: Number = Field(0.2, ge=0, description="entropy: relative floor (see entropy_abs_floor)")
    ratio_max_limit: Number = Field(10.0, gt=0, description="importance ratio (first epoch): window max ratio_max "
                                    ">= this, over the window's steps with staleness 0 (or no staleness column)")
    ratio_min_limit: Number = Field(0.1, ge=0, description="importance ratio: window min ratio_min <= this")
    unique_abs_floor: Number = Field(0.5, ge=0, le=1, description="repetition: window median unique-completion "
                                     "share <= this and <= unique_rel_floor x the baseline")
    unique_rel_floor: Number = Field(0.6, ge=0, description="repetition: relative floor (see unique_abs_floor)")


class EntropyConfig(_AsGiven):
    """G-entropy: window median entropy <= max(abs_floor, rel_floor x baseline median). A flag, serious
    only when the KL to the reference has exploded too (window max kl_ref_max >= serious_kl_max)."""

    window: Count = Field(5, ge=1, description="trailing steps whose median entropy is judged")
    baseline_steps: Count = Field(5, ge=1, description="the run's first steps whose median entropy is the baseline")
    abs_floor: Number = Field(0.03, ge=0, description="entropy at or under this fires")
    rel_floor: Number = Field(0.2, ge=0, description="entropy at or under this x the baseline fires")
    serious_kl_max: Number | None = Field(1000.0, gt=0, description="serious when the window max kl_ref_max reaches "
                                          "this inside an episode; None = never serious")
    serious_drift_max: Number | None = Field(100.0, gt=0, description="without a reference (kl_ref_* unknown): "
                                             "serious when the window max drift/kl_max (the beta-0 drift signal, one "
                                             "update's KL on the step's samples) reaches this; None = never serious "
                                             "without a reference")
    rearm_steps: Count | None = Field(None, ge=1, description="steps the condition must be false before a new "
                                      "episode can fire; None = window")


class RewardHackingConfig(_AsGiven):
    """G-reward-hacking: per eval name, at each eval point, the held-out level (mean of the last
    `confirm_evals` eval values) fell >= min_eval_drop below the reference, the training reward level
    (mean reward_mean over the last `reward_window` steps) did not fall (rise >= min_train_rise), and the
    gap (train rise - eval change) >= min_divergence.

    Reference: `base_eval[name]` when given (the base model's score, step 0; its train-reward reference is
    the first `reward_window` steps), else the first eval point (train reference = the train level there).
    Eval columns: every `eval/<name>` whose values all lie in [0, 1] (accuracy-like, higher is better),
    or only `eval_names` when given.

    Noise: when the number of eval problems n is known (`eval_n`, an int for every name or a mapping
    name -> n, or an `eval/<name>_n` column, which the [0, 1] rule already keeps out of the comparisons),
    the drop must also exceed `noise_z` binomial standard errors of (level - reference):
    sqrt(p (1 - p) / n * (1 + 1 / confirm_evals)). Without n the absolute `min_eval_drop` is the only bar.
    """

    eval_names: tuple[str, ...] | None = Field(None, description="the eval names compared; None = every eval/<name> "
                                               "column whose values lie in [0, 1]")
    base_eval: dict[str, Number] | None = Field(None, description="the base model's score per eval name (the "
                                                "reference); None = the trainer fills in the base model's evaluation, "
                                                "else the first eval point is the reference")
    eval_n: Count | dict[str, Count] | None = Field(None, description="eval problems n (one for every name, or per "
                                                    "name) for the noise bar; None = the eval/<name>_n columns")
    reward_window: Count = Field(10, ge=1, description="steps whose mean reward_mean is the training reward level")
    confirm_evals: Count = Field(2, ge=1, description="eval points whose mean is the held-out level")
    min_eval_drop: Number = Field(0.04, ge=0, description="the held-out level's drop below the reference that fires")
    noise_z: Number = Field(2.0, ge=0, description="with n known, the drop must also exceed this many binomial "
                            "standard errors")
    min_train_rise: Number = Field(0.0, description="the training reward level's change that counts as not falling")
    min_divergence: Number = Field(0.05, ge=0, description="train rise - eval change at or above this fires")
    rearm_evals: Count = Field(2, ge=1, description="eval points the condition must be false before a new episode")
    serious: Flag = Field(False, description="true: a firing stops the run; false: a flag")


class KLExplosionConfig(_AsGiven):
    """G-kl-explosion (episode detector; the trainer also flags single steps above `grpo.guards.kl_spike_max`):
    window median kl_ref_mean >= mean_limit or window max kl_ref_max >= max_limit. A window without a
    reference model (kl NaN) watches the beta-0 drift columns instead (drift_*_limit); without those
    either, nothing fires."""

    window: Count = Field(5, ge=1, description="trailing steps judged")
    mean_limit: Number = Field(0.25, gt=0, description="window median kl_ref_mean at or above this fires")
    max_limit: Number = Field(1000.0, gt=0, description="window max kl_ref_max at or above this fires")
    drift_mean_limit: Number | None = Field(0.5, gt=0, description="without a reference (no kl_ref_* in the window): "
                                            "window median drift/kl_mean (the beta-0 drift signal) at or above this "
                                            "fires; None = not watched")
    drift_max_limit: Number | None = Field(100.0, gt=0, description="without a reference: window max drift/kl_max at "
                                           "or above this fires; None = not watched")
    serious: Flag = Field(False, description="true: every episode stops the run")
    serious_on_collapse: Flag = Field(True, description="a sustained explosion (window median kl_ref_mean >= "
                                      "mean_limit, not one max spike) stops the run without `serious` when the "
                                      "rollouts show the collapse with it (evidence_*); once per episode, key "
                                      "'collapse'")
    evidence_truncation_share: Number = Field(0.5, ge=0, le=1, description="collapse evidence: window median "
                                              "truncated share at or above this (and above the base model's on the "
                                              "same prompts when known)")
    evidence_zero_var_share: Number = Field(0.9, ge=0, le=1, description="collapse evidence: window median "
                                            "zero-reward-variance group share at or above this")
    rearm_steps: Count | None = Field(None, ge=1, description="steps the condition must be false before a new "
                                      "episode can fire; None = window")


class NoSignalConfig(_AsGiven):
    """G-no-signal: at least `min_dead_steps` of the trailing `window` steps (fewer at the start of a run) trained
    no token or nearly none: every group dropped (`n_tokens` 0) or at least `starved_share` of them without reward
    variance (`zero_var_group_share`, dropped groups included). Such a run spends its budget learning nothing, so the
    firing stops it (serious), naming the cause (`rlvr_core.experiment.no_signal.no_signal_cause`). The last four
    fields are the run's settings the cause names, filled in by the trainer (`run_health`), not thresholds."""

    window: Count = Field(5, ge=1, description="trailing steps judged (fewer at the start of a run)")
    min_dead_steps: Count = Field(4, ge=1, description="steps of the window that trained no token or nearly none "
                                  "(more than window: off)")
    starved_share: Number = Field(0.95, gt=0, le=1, description="a step whose zero-variance share (dropped groups "
                                  "included) is at or above this counts as dead too. Healthy demo steps peak at "
                                  "0.71; near-greedy rollouts (grpo.temperature 0.05) keep 0-2 of 48 groups")
    serious: Flag = Field(True, description="true: a firing stops the run (and the check before training does); "
                          "false: a flag")
    rearm_steps: Count | None = Field(None, ge=1, description="steps the condition must be false before a new "
                                      "episode can fire; None = window")
    verifier: str | None = Field(None, description="filled in by the trainer: reward.verifier")
    verifier_mode: str | None = Field(None, description="filled in by the trainer: reward.mode")
    temperature: Number | None = Field(None, description="filled in by the trainer: grpo.temperature (the rollouts')")
    passrate_temperature: Number | None = Field(None, description="filled in by the trainer: sampling.temperature "
                                                "(the pass-rate table's, the curriculum's filter)")


class HealthConfig(_AsGiven):
    """`grpo.guards.health`: the run-level training guards' settings (docs/guards_training.md), one section per
    detector, e.g. `{collapse: {grad_norm_factor: 8}, kl_explosion: {serious: true}}`; what is not given keeps its
    default."""

    collapse: CollapseConfig = Field(default_factory=CollapseConfig, description="G-collapse's thresholds")
    entropy: EntropyConfig = Field(default_factory=EntropyConfig, description="G-entropy's thresholds")
    reward_hacking: RewardHackingConfig = Field(default_factory=RewardHackingConfig,
                                                description="G-reward-hacking's thresholds")
    kl_explosion: KLExplosionConfig = Field(default_factory=KLExplosionConfig,
                                            description="G-kl-explosion's episode thresholds")
    no_signal: NoSignalConfig = Field(default_factory=NoSignalConfig, description="G-no-signal's thresholds")
    enabled: tuple[str, ...] = Field(GUARD_IDS, description="the guard ids to run (a guard left out is off)")

    @field_validator("enabled")
    @classmethod
    def _known_ids(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        unknown = sorted(set(v) - set(GUARD_IDS))
        if unknown:
            raise ValueError(f"unknown guard id(s) {unknown}; known: {list(GUARD_IDS)}")
        return v


# ------------------------------------------------------------------------------------------- helpers
def _num(v: Any) -> float | None:
    """A finite float, +inf/-inf kept; None, NaN, bools-as-missing and non-numbers -> None."""
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _values(rows: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    return [x for x in (_num(r.get(key)) for r in rows) if x is not None]


def _median(rows: Sequence[Mapping[str, Any]], key: str, *, need: int | None = None) -> float | None:
    """Median of the known values; None when fewer than `need` (default: half the rows, rounded up) exist."""
    vals = _values(rows, key)
    need = (len(rows) + 1) // 2 if need is None else need
    if not vals or len(vals) < max(1, need):
        return None
    return float(statistics.median(vals))


def _max(rows: Sequence[Mapping[str, Any]], key: str) -> float | None:
    vals = _values(rows, key)
    return max(vals) if vals else None


def _min(rows: Sequence[Mapping[str, Any]], key: str) -> float | None:
    vals = _values(rows, key)
    return min(vals) if vals else None


def _step(rows: Sequence[Mapping[str, Any]], i: int) -> int:
    s = _num(rows[i].get("step"))
    return int(s) if s is not None and math.isfinite(s) else i + 1


def _fmt(x: float | None) -> str:
    if x is None:
        return "n/a"
    if math.isinf(x):
        return "inf"
    return f"{x:.4g}"


class _Episodes:
    """Fires at the first true step after at least `rearm` consecutive non-true steps (or the start)."""

    def __init__(self, rearm: int) -> None:
        self.rearm = max(1, rearm)
        self.active = False
        self.false_run = 0

    def update(self, cond: bool) -> bool:
        if cond:
            self.false_run = 0
            if not self.active:
                self.active = True
                return True
            return False
        if self.active:
            self.false_run += 1
            if self.false_run >= self.rearm:
                self.active = False
        return False


# ------------------------------------------------------------------------------------------- G-collapse
def _collapse_signals(rows: Sequence[Mapping[str, Any]], i: int, cfg: CollapseConfig,
                      state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Evaluate every collapse signal on the window ending at row i. `state` carries the baselines and
    the running reward peak (computed from rows[:baseline_steps] and the windows so far)."""
    W = cfg.window
    win = rows[i - W + 1:i + 1]
    base = state["base"]
    out: dict[str, dict[str, Any]] = {}

    gmax, gbase = _max(win, "grad_norm"), base.get("grad_norm")
    if gmax is not None and gbase is not None and gbase > 0:
        out["grad_norm"] = {"window_max": gmax, "baseline_median": gbase, "factor": gmax / gbase,
                            "limit_factor": cfg.grad_norm_factor,
                            "fired": gmax >= cfg.grad_norm_factor * gbase,
                            "text": f"grad_norm max {_fmt(gmax)} = {_fmt(gmax / gbase)}x its early median "
                                    f"{_fmt(gbase)} (limit {cfg.grad_norm_factor:g}x)"}

    rmed, peak, rbase = _median(win, "reward_mean"), state["reward_peak"], state["reward_base"]
    ref = max((x for x in (peak, rbase) if x is not None), default=None)
    if rmed is not None and ref is not None and ref >= cfg.reward_peak_min:
        against = (f"the base model's {_fmt(ref)} on the same prompts" if ref == rbase
                   else f"a peak of {_fmt(ref)}")
        out["reward"] = {"window_median": rmed, "peak_window_median": peak, "base_expected": rbase,
                         "reference": ref, "rel_floor": cfg.reward_rel_floor,
                         "fired": rmed <= cfg.reward_rel_floor * ref,
                         "text": f"reward median {_fmt(rmed)} against {against} "
                                 f"(floor {cfg.reward_rel_floor:g}x that)"}

    lkey, src = state["len_key"], state["source"]
    lmed, lbase = _median(win, lkey), base.get(lkey)
    if lmed is not None:
        floor = cfg.len_abs_floor if lbase is None else max(cfg.len_abs_floor, cfg.len_rel_floor * lbase)
        what = "median" if lkey == "completion_len_median" else "mean"
        out["completion_len"] = {"column": lkey, "window_median": lmed, "baseline_median": lbase,
                                 "floor": floor, "fired": lmed <= floor,
                                 "text": f"{what} completion length {_fmt(lmed)} tokens vs {src} {_fmt(lbase)} "
                                         f"(floor {_fmt(floor)}: {cfg.len_abs_floor:g} tokens or "
                                         f"{cfg.len_rel_floor:g}x that)"}

    tmed, tbase = _median(win, "truncation_share"), base.get("truncation_share")
    if tmed is not None and tbase is not None and tbase <= cfg.truncation_baseline_max:
        out["truncation"] = {"window_median": tmed, "baseline_median": tbase, "limit": cfg.truncation_share_max,
                             "fired": tmed >= cfg.truncation_share_max,
                             "text": f"truncated share {_fmt(tmed)} vs {src} {_fmt(tbase)} "
                                     f"(limit {cfg.truncation_share_max:g})"}

    emed, ebase = _median(win, "entropy"), base.get("entropy")
    if emed is not None:
        floor = cfg.entropy_abs_floor if ebase is None else max(cfg.entropy_abs_floor, cfg.entropy_rel_floor * ebase)
        out["entropy"] = {"window_median": emed, "baseline_median": ebase, "floor": floor, "fired": emed <= floor,
                          "text": f"entropy {_fmt(emed)} vs early {_fmt(ebase)} (floor {_fmt(floor)})"}

    # Only steps trained on their own weights' rollouts: with stale rollouts (max_staleness > 0) the ratio
    # measures how far the last updates moved each token, and single tokens at 0.03 are normal there.
    fresh = [r for r in win if not _num(r.get("staleness"))]
    rmax, rmin = _max(fresh, "ratio_max"), _min(fresh, "ratio_min")
    if rmax is not None or rmin is not None:
        hi = rmax is not None and rmax >= cfg.ratio_max_limit
        lo = rmin is not None and rmin <= cfg.ratio_min_limit
        out["ratio"] = {"window_max": rmax, "window_min": rmin, "max_limit": cfg.ratio_max_limit,
                        "min_limit": cfg.ratio_min_limit, "fired": hi or lo,
                        "text": f"importance ratio max {_fmt(rmax)} / min {_fmt(rmin)} "
                                f"(limits {cfg.ratio_max_limit:g} / {cfg.ratio_min_limit:g})"}

    umed, ubase = _median(win, "unique_frac_mean"), base.get("unique_frac_mean")
    if umed is not None:
        floor = cfg.unique_abs_floor if ubase is None else min(cfg.unique_abs_floor, cfg.unique_rel_floor * ubase)
        out["repetition"] = {"window_median": umed, "baseline_median": ubase, "floor": floor, "fired": umed <= floor,
                             "text": f"unique-completion share {_fmt(umed)} vs early {_fmt(ubase)} "
                                     f"(floor {_fmt(floor)})"}
    return out


# The step row's base-model columns (the pass-rate table's numbers on the prompts the step drew) and the
# collapse baseline each one stands for.
BASE_COLUMNS = {"reward_mean": "base/reward_mean", "truncation_share": "base/truncation_share",
                "completion_len_mean": "base/completion_len_mean"}
_BASE_SIGNALS = ("reward", "truncation", "completion_len")
_OWN_BASELINE = ("grad_norm", "completion_len_mean", "completion_len_median", "truncation_share", "entropy",
                 "unique_frac_mean")


def base_window(rows: Sequence[Mapping[str, Any]], i: int, window: int) -> dict[str, float] | None:
    """Medians of the base-model columns over the window ending at row i; None when the rows carry no
    base reward (no pass-rate table, or a run recorded before these columns existed)."""
    win = rows[max(0, i - window + 1):i + 1]
    out = {k: _median(win, col) for k, col in BASE_COLUMNS.items()}
    return None if out["reward_mean"] is None else {k: v for k, v in out.items() if v is not None}


class _CollapseScan:
    guard_id = GUARD_COLLAPSE

    def __init__(self, cfg: CollapseConfig) -> None:
        self.cfg = cfg
        self.ep = _Episodes(cfg.rearm_steps or cfg.window)
        self.own: dict[str, float | None] | None = None  # medians over the run's first baseline_steps steps
        self.reward_peak: float | None = None

    def step(self, rows: Sequence[Mapping[str, Any]], i: int) -> list[Firing]:
        cfg, W, B = self.cfg, self.cfg.window, self.cfg.baseline_steps
        if i + 1 >= W:  # running peak of the trailing-window reward median (includes the baseline region)
            m = _median(rows[i - W + 1:i + 1], "reward_mean")
            if m is not None and (self.reward_peak is None or m > self.reward_peak):
                self.reward_peak = m
        ext = base_window(rows, i, W) if i + 1 >= W else None
        if i + 1 < B + W and ext is None:
            return []
        if i + 1 >= B + W and self.own is None:
            self.own = {k: _median(rows[:B], k) for k in _OWN_BASELINE}
        base = dict(self.own or {})
        len_key = "completion_len_median" if base.get("completion_len_median") is not None else "completion_len_mean"
        if ext is not None:  # the base model's numbers on the same prompts replace the run's own first steps
            base.update(ext)
            len_key = "completion_len_mean"
        state = {"base": base, "reward_peak": self.reward_peak, "len_key": len_key,
                 "reward_base": (ext or {}).get("reward_mean"), "source": "base" if ext is not None else "early"}
        sig = _collapse_signals(rows, i, cfg, state)
        if self.own is None:  # before the run's own baselines exist: only the signals the base model backs
            sig = {k: v for k, v in sig.items() if k in _BASE_SIGNALS}
        fired = [k for k, v in sig.items() if v["fired"]]
        if not self.ep.update(len(fired) >= cfg.min_signals):
            return []
        step = _step(rows, i)
        first = _step(rows, i - W + 1)
        reason = (f"{GUARD_COLLAPSE} at step {step}: {len(fired)} collapse signals over steps {first}-{step} "
                  f"(need {cfg.min_signals}): " + "; ".join(sig[k]["text"] for k in fired))
        evidence = {"signals": fired, "window": [first, step],
                    "baseline": "base model on the same prompts" if ext is not None else f"first {B} steps",
                    **{k: {kk: vv for kk, vv in v.items() if kk != "text"} for k, v in sig.items()}}
        return [Firing(GUARD_COLLAPSE, step, cfg.serious, reason, evidence)]


# ------------------------------------------------------------------------------------------- G-entropy
class _EntropyScan:
    guard_id = GUARD_ENTROPY

    def __init__(self, cfg: EntropyConfig) -> None:
        self.cfg = cfg
        rearm = cfg.rearm_steps or cfg.window
        self.ep_floor, self.ep_kl = _Episodes(rearm), _Episodes(rearm)
        self.base: float | None = None
        self.have_base = False

    def step(self, rows: Sequence[Mapping[str, Any]], i: int) -> list[Firing]:
        cfg, W, B = self.cfg, self.cfg.window, self.cfg.baseline_steps
        if i + 1 < B + W:
            return []
        if not self.have_base:
            self.base, self.have_base = _median(rows[:B], "entropy"), True
        win = rows[i - W + 1:i + 1]
        emed = _median(win, "entropy")
        floor = cfg.abs_floor if self.base is None else max(cfg.abs_floor, cfg.rel_floor * self.base)
        low = emed is not None and emed <= floor
        kl_max, kl_mean = _max(win, "kl_ref_max"), _median(win, "kl_ref_mean")
        kl_bad = low and cfg.serious_kl_max is not None and kl_max is not None and kl_max >= cfg.serious_kl_max
        drift_max = _max(win, "drift/kl_max") if kl_max is None else None
        kl_bad = kl_bad or (low and cfg.serious_drift_max is not None and drift_max is not None
                            and drift_max >= cfg.serious_drift_max)
        new_floor, new_kl = self.ep_floor.update(low), self.ep_kl.update(kl_bad)
        if not (new_floor or new_kl):
            return []
        step, first = _step(rows, i), _step(rows, i - W + 1)
        serious = bool(kl_bad)
        reason = (f"{GUARD_ENTROPY} at step {step}: entropy median {_fmt(emed)} over steps {first}-{step} "
                  f"vs early {_fmt(self.base)} (floor {_fmt(floor)}: {cfg.abs_floor:g} absolute or "
                  f"{cfg.rel_floor:g}x early)")
        if kl_max is not None:
            reason += f"; kl_ref_max {_fmt(kl_max)}, kl_ref_mean {_fmt(kl_mean)}"
            if serious:
                reason += f" (>= {cfg.serious_kl_max:g}: the policy went deterministic far from the reference)"
        elif drift_max is not None:
            reason += f"; drift/kl_max {_fmt(drift_max)} (no reference model)"
            if serious:
                reason += (f" (>= {cfg.serious_drift_max:g}: the policy went deterministic while single updates "
                           "still moved it violently)")
        evidence = {"entropy_window_median": emed, "entropy_baseline_median": self.base, "floor": floor,
                    "window": [first, step], "kl_ref_max_window_max": kl_max, "kl_ref_mean_window_median": kl_mean,
                    "serious_kl_max": cfg.serious_kl_max, "drift_kl_max_window_max": drift_max,
                    "serious_drift_max": cfg.serious_drift_max}
        # One episode of low entropy fires once; it fires a second, serious, time only if the KL explodes
        # later inside it (an escalation, key "kl").
        key = "kl" if (new_kl and not new_floor) else ""
        return [Firing(GUARD_ENTROPY, step, serious, reason, evidence, key)]


# ------------------------------------------------------------------------------------------- G-kl-explosion
class _KLScan:
    guard_id = GUARD_KL_EXPLOSION

    def __init__(self, cfg: KLExplosionConfig) -> None:
        self.cfg = cfg
        self.ep = _Episodes(cfg.rearm_steps or cfg.window)
        self.ep_collapse = _Episodes(cfg.rearm_steps or cfg.window)

    def step(self, rows: Sequence[Mapping[str, Any]], i: int) -> list[Firing]:
        cfg, W = self.cfg, self.cfg.window
        if i + 1 < W:
            return []
        win = rows[i - W + 1:i + 1]
        kmean, kmax = _median(win, "kl_ref_mean"), _max(win, "kl_ref_max")
        hit_mean = kmean is not None and kmean >= cfg.mean_limit
        hit_max = kmax is not None and kmax >= cfg.max_limit
        drift = self._drift(win) if kmean is None and kmax is None else None
        evidence = self._collapse_evidence(win) if hit_mean and cfg.serious_on_collapse and not cfg.serious else None
        new_ep = self.ep.update(hit_mean or hit_max or bool(drift and drift["hit"]))
        new_serious = self.ep_collapse.update(evidence is not None)
        if not (new_ep or new_serious):
            return []
        step, first = _step(rows, i), _step(rows, i - W + 1)
        if drift is not None:
            reason = (f"{GUARD_KL_EXPLOSION} at step {step}: no reference model; over steps {first}-{step} the "
                      f"per-update drift/kl_mean median {_fmt(drift['mean'])} (limit {_fmt(cfg.drift_mean_limit)}), "
                      f"drift/kl_max {_fmt(drift['max'])} (limit {_fmt(cfg.drift_max_limit)})")
            ev = {"drift_kl_mean_window_median": drift["mean"], "drift_kl_max_window_max": drift["max"],
                  "drift_mean_limit": cfg.drift_mean_limit, "drift_max_limit": cfg.drift_max_limit,
                  "window": [first, step]}
            return [Firing(GUARD_KL_EXPLOSION, step, cfg.serious, reason, ev)]
        reason = (f"{GUARD_KL_EXPLOSION} at step {step}: over steps {first}-{step} kl_ref_mean median "
                  f"{_fmt(kmean)} (limit {cfg.mean_limit:g}), kl_ref_max {_fmt(kmax)} (limit {cfg.max_limit:g})")
        ev = {"kl_ref_mean_window_median": kmean, "kl_ref_max_window_max": kmax, "mean_limit": cfg.mean_limit,
              "max_limit": cfg.max_limit, "window": [first, step]}
        if evidence is not None:
            reason += f", with the rollouts collapsing: {evidence['text']}"
            ev["collapse_evidence"] = {k: v for k, v in evidence.items() if k != "text"}
        # The first firing of an episode is serious when the evidence is there already; evidence that comes
        # later inside the episode escalates it once (key "collapse").
        key = "collapse" if (new_serious and not new_ep) else ""
        return [Firing(GUARD_KL_EXPLOSION, step, cfg.serious or evidence is not None, reason, ev, key)]

    def _collapse_evidence(self, win: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
        """What in the window's rollouts shows the policy collapsing with the KL (None: nothing)."""
        cfg, out = self.cfg, []
        tmed, tbase = _median(win, "truncation_share"), _median(win, BASE_COLUMNS["truncation_share"])
        if tmed is not None and tmed >= cfg.evidence_truncation_share and (tbase is None or tmed > 2 * tbase):
            out.append(f"truncated share {_fmt(tmed)}" + (f" (base model {_fmt(tbase)})" if tbase is not None else "")
                       + f" >= {cfg.evidence_truncation_share:g}")
        zmed = _median(win, "zero_var_group_share")
        if zmed is not None and zmed >= cfg.evidence_zero_var_share:
            out.append(f"zero-reward-variance groups {_fmt(zmed)} >= {cfg.evidence_zero_var_share:g}")
        if not out:
            return None
        return {"truncation_share_window_median": tmed, "base_truncation_share": tbase,
                "zero_var_group_share_window_median": zmed, "text": "; ".join(out)}

    def _drift(self, win: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
        """The beta-0 drift columns over the window (None when none was measured)."""
        dmean, dmax = _median(win, "drift/kl_mean"), _max(win, "drift/kl_max")
        if dmean is None and dmax is None:
            return None
        lm, lx = self.cfg.drift_mean_limit, self.cfg.drift_max_limit
        hit = (lm is not None and dmean is not None and dmean >= lm) or (lx is not None and dmax is not None
                                                                         and dmax >= lx)
        return {"mean": dmean, "max": dmax, "hit": hit}


# ------------------------------------------------------------------------------------------- G-reward-hacking
class _RewardHackingScan:
    guard_id = GUARD_REWARD_HACKING

    def __init__(self, cfg: RewardHackingConfig) -> None:
        self.cfg = cfg
        self.points: dict[str, list[tuple[int, float, float | None]]] = {}  # name -> [(step, eval, train level)]
        self.eps: dict[str, _Episodes] = {}
        self.excluded: set[str] = set()
        self.early_reward: list[float] = []
        self.n_seen: dict[str, float] = {}

    def _train_level(self, rows: Sequence[Mapping[str, Any]], i: int) -> float | None:
        vals = _values(rows[max(0, i - self.cfg.reward_window + 1):i + 1], "reward_mean")
        vals = [v for v in vals if math.isfinite(v)]
        return sum(vals) / len(vals) if vals else None

    def step(self, rows: Sequence[Mapping[str, Any]], i: int) -> list[Firing]:
        cfg = self.cfg
        r = rows[i]
        v = _num(r.get("reward_mean"))
        if len(self.early_reward) < cfg.reward_window and i < cfg.reward_window and v is not None and math.isfinite(v):
            self.early_reward.append(v)
        out: list[Firing] = []
        names = [k[5:] for k in r if k.startswith("eval/")]
        if cfg.eval_names is not None:
            names = [n for n in names if n in cfg.eval_names]
        for name in names:
            val = _num(r.get(f"eval/{name}"))
            if val is None or not math.isfinite(val):
                continue
            if not (0.0 <= val <= 1.0):
                # Not an accuracy (a loss, a count): never compared, even if earlier values looked like one.
                self.excluded.add(name)
            if name in self.excluded:
                continue
            n = _num(r.get(f"eval/{name}_n"))
            if n is not None and math.isfinite(n) and n > 0:
                self.n_seen[name] = n
            pts = self.points.setdefault(name, [])
            pts.append((_step(rows, i), val, self._train_level(rows, i)))
            ep = self.eps.setdefault(name, _Episodes(cfg.rearm_evals))
            f = self._evaluate(name, pts)
            if ep.update(f is not None) and f is not None:
                out.append(f)
        return out

    def _eval_n(self, name: str) -> float | None:
        n = self.cfg.eval_n
        if isinstance(n, Mapping):
            n = n.get(name)
        got = _num(n)
        if got is not None and math.isfinite(got) and got > 0:
            return got
        return self.n_seen.get(name)

    def _evaluate(self, name: str, pts: list[tuple[int, float, float | None]]) -> Firing | None:
        cfg = self.cfg
        base = None if cfg.base_eval is None else _num(cfg.base_eval.get(name))
        if base is not None:
            ref_eval, ref_step = base, 0
            ref_train = sum(self.early_reward) / len(self.early_reward) if self.early_reward else None
            candidates = pts
        else:
            ref_step, ref_eval, ref_train = pts[0]
            candidates = pts[1:]
        if len(candidates) < cfg.confirm_evals or ref_train is None:
            return None
        recent = candidates[-cfg.confirm_evals:]
        level = sum(p[1] for p in recent) / len(recent)
        step, val, train = pts[-1]
        if train is None:
            return None
        d_eval, d_train = level - ref_eval, train - ref_train
        gap = d_train - d_eval
        n = self._eval_n(name)
        noise = None
        if n is not None:
            p = min(max((ref_eval + level) / 2, 0.05), 0.95)
            noise = cfg.noise_z * math.sqrt(p * (1 - p) / n * (1 + 1 / len(recent)))
        need = max(cfg.min_eval_drop, noise or 0.0)
        if not (d_eval <= -need and d_train >= cfg.min_train_rise and gap >= cfg.min_divergence):
            return None
        src = "base model" if base is not None else f"first eval (step {ref_step})"
        bar = f"drop {need * 100:.3g}"
        if noise is not None and noise > cfg.min_eval_drop:
            bar += f" = {cfg.noise_z:g} s.e. at n={n:g}"
        reason = (f"{GUARD_REWARD_HACKING} at step {step}: held-out eval/{name} "
                  f"{_fmt(ref_eval)} -> {_fmt(level)} (mean of the last {len(recent)} evals, steps "
                  f"{recent[0][0]}-{recent[-1][0]}; {d_eval * 100:+.1f} points vs the {src}) while the training "
                  f"reward went {_fmt(ref_train)} -> {_fmt(train)} ({d_train * 100:+.1f} points, "
                  f"{cfg.reward_window}-step means): divergence {gap * 100:.1f} points "
                  f"(limits: {bar}, divergence {cfg.min_divergence * 100:g})")
        evidence = {"eval_name": name, "reference": "base" if base is not None else "first_eval",
                    "reference_step": ref_step, "eval_reference": ref_eval, "eval_level": level, "eval_last": val,
                    "eval_points": [[s, e] for s, e, _ in pts], "train_reference": ref_train, "train_level": train,
                    "eval_change": d_eval, "train_change": d_train, "divergence": gap, "eval_n": n,
                    "required_drop": need}
        return Firing(GUARD_REWARD_HACKING, step, cfg.serious, reason, evidence, key=name)


# ------------------------------------------------------------------------------------------- G-no-signal
def _dead(row: Mapping[str, Any], cfg: NoSignalConfig) -> bool:
    """A step that trained no token, or nearly none: every group dropped (n_tokens 0), or at least `starved_share` of
    the groups sampled without reward variance.
    Unless the rollouts are known to sample near greedy, a step whose groups repeat one completion (distinct share
    <= REPEATED_UNIQUE) is left out:
    that is a policy that collapsed (G-collapse's) or a fixed seed (G-fixed-seed's), not a run without a signal."""
    n, z = _num(row.get("n_tokens")), _num(row.get("zero_var_group_share"))
    u = _num(row.get("unique_frac_mean"))
    greedy = cfg.temperature is not None and cfg.temperature <= NEAR_GREEDY
    if not greedy and u is not None and u <= REPEATED_UNIQUE:
        return False
    return n == 0 or (z is not None and z >= cfg.starved_share)


class _NoSignalScan:
    guard_id = GUARD_NO_SIGNAL

    def __init__(self, cfg: NoSignalConfig) -> None:
        self.cfg = cfg
        self.ep = _Episodes(cfg.rearm_steps or cfg.window)

    def step(self, rows: Sequence[Mapping[str, Any]], i: int) -> list[Firing]:
        cfg = self.cfg
        win = rows[max(0, i - cfg.window + 1):i + 1]
        dead = sum(_dead(r, cfg) for r in win)
        if not self.ep.update(dead >= cfg.min_dead_steps):
            return []
        facts = window_facts(win)
        kind, cause = no_signal_cause(facts, verifier=cfg.verifier, mode=cfg.verifier_mode,
                                      temperature=cfg.temperature, passrate_temperature=cfg.passrate_temperature)
        step, first = _step(rows, i), _step(rows, max(0, i - cfg.window + 1))
        reason = (f"{GUARD_NO_SIGNAL} at step {step}: {dead} of the {len(win)} steps {first}-{step} trained no token "
                  f"or nearly none (>= {cfg.starved_share:.0%} of the groups dropped or without reward variance; limit "
                  f"{cfg.min_dead_steps} of {cfg.window}); cause: {cause}")
        evidence = {**facts, "dead_steps": dead, "window": [first, step], "min_dead_steps": cfg.min_dead_steps,
                    "cause": kind}
        return [Firing(GUARD_NO_SIGNAL, step, cfg.serious, reason, evidence)]


# ------------------------------------------------------------------------------------------- public API
def _scans(cfg: HealthConfig) -> list[Any]:
    makers = {GUARD_COLLAPSE: lambda: _CollapseScan(cfg.collapse), GUARD_ENTROPY: lambda: _EntropyScan(cfg.entropy),
              GUARD_REWARD_HACKING: lambda: _RewardHackingScan(cfg.reward_hacking),
              GUARD_KL_EXPLOSION: lambda: _KLScan(cfg.kl_explosion),
              GUARD_NO_SIGNAL: lambda: _NoSignalScan(cfg.no_signal)}
    unknown = [g for g in cfg.enabled if g not in makers]
    if unknown:
        raise ValueError(f"unknown guard ids {unknown}; known: {list(makers)}")
    return [makers[g]() for g in GUARD_IDS if g in cfg.enabled]


class HealthMonitor:
    """Incremental form of `check_health`: `update(rows)` looks only at rows it has not seen yet and
    returns their firings. `update` must be given the same growing list (rows are never edited except to
    add `health/*` keys, which the detectors ignore). Same firings as `check_health` on the same rows."""

    def __init__(self, cfg: HealthConfig | None = None) -> None:
        self.cfg = cfg or HealthConfig()
        self._scans = _scans(self.cfg)
        self._seen = 0
        self.firings: list[Firing] = []

    def update(self, rows: Sequence[Mapping[str, Any]]) -> list[Firing]:
        if len(rows) < self._seen:
            raise ValueError(f"rows shrank from {self._seen} to {len(rows)}; start a new HealthMonitor")
        new: list[Firing] = []
        for i in range(self._seen, len(rows)):
            for s in self._scans:
                new.extend(s.step(rows, i))
        self._seen = len(rows)
        self.firings.extend(new)
        return new


def _run(scan: Any, rows: Sequence[Mapping[str, Any]]) -> list[Firing]:
    out: list[Firing] = []
    for i in range(len(rows)):
        out.extend(scan.step(rows, i))
    return out


def detect_collapse(rows: Sequence[Mapping[str, Any]], cfg: CollapseConfig | None = None) -> list[Firing]:
    """G-collapse firings over the whole history (one per episode; serious by default)."""
    return _run(_CollapseScan(cfg or CollapseConfig()), rows)


def detect_entropy(rows: Sequence[Mapping[str, Any]], cfg: EntropyConfig | None = None) -> list[Firing]:
    """G-entropy firings over the whole history (a flag; serious with an exploded KL to the reference)."""
    return _run(_EntropyScan(cfg or EntropyConfig()), rows)


def detect_reward_hacking(rows: Sequence[Mapping[str, Any]],
                          cfg: RewardHackingConfig | None = None) -> list[Firing]:
    """G-reward-hacking firings over the whole history, per eval name (a flag by default)."""
    return _run(_RewardHackingScan(cfg or RewardHackingConfig()), rows)


def detect_kl_explosion(rows: Sequence[Mapping[str, Any]], cfg: KLExplosionConfig | None = None) -> list[Firing]:
    """G-kl-explosion episodes over the whole history (a flag by default)."""
    return _run(_KLScan(cfg or KLExplosionConfig()), rows)


def detect_no_signal(rows: Sequence[Mapping[str, Any]], cfg: NoSignalConfig | None = None) -> list[Firing]:
    """G-no-signal episodes over the whole history (a stop by default)."""
    return _run(_NoSignalScan(cfg or NoSignalConfig()), rows)


def check_health(rows: Sequence[Mapping[str, Any]], cfg: HealthConfig | None = None, *,
                 previous: Iterable[Firing] = ()) -> list[Firing]:
    """Every enabled detector over all rows; returns the firings not already in `previous`.

    Idempotent and causal (see the module docstring): call it after each step with all rows so far and
    the firings returned so far, and each episode is reported exactly once, at the step it starts.
    Ordered by step, then by guard id order in GUARD_IDS.
    """
    seen = {f.ident for f in previous}
    out = HealthMonitor(cfg).update(rows)
    return [f for f in out if f.ident not in seen]


def health_flags(firings: Iterable[Firing], step: int) -> dict[str, int]:
    """`{"health/<id>": 0/1}` for every guard id: 1 when a firing of that guard is at `step`."""
    at = {f.guard_id for f in firings if f.step == step}
    return {f"health/{g}": int(g in at) for g in GUARD_IDS}


def firing_dict(f: Firing) -> dict[str, Any]:
    """A JSON-friendly dict of a firing (for summaries)."""
    return asdict(f)
