"""What the GRPO trainer records per step: the step row, the per-step guard flags, the rollout sample for
rollouts.parquet, the run-level guards' bookkeeping, and the run summary.

Rollout statistics (reward_mean/std, zero_var_group_share, completion_len_mean, truncation_share,
unique_frac_mean, status counts, overlong columns, the G-fixed-seed and G-verifier-format flags,
tokens_per_s) cover every group sampled in the step (all rounds); loss, ratio, entropy, log-prob mismatch
and n_tokens cover the trained groups. Every rank derives the same row from gathered / all-reduced numbers;
only rank 0 writes it (and adds eval/* columns).

Guards (ids from BUGZOO; counts in the summary as `health/<id>`):
  * G-logprob-temp: at step 1 the trainer's log-probs of the sampled tokens must equal the rollout's
    (mean |diff| under a float tolerance) before any update, else GuardError naming both temperatures
    (`update.check_logprob_temp`).
  * G-onpolicy-ratio: flagged when a step with staleness 0 has a first-epoch ratio that is not ~1 or clips,
    or a mean log-prob mismatch between rollout engine and trainer above the tolerance (an engine whose
    weights were not synced after an update shows up here).
  * G-kl-explosion: KL-to-reference max above a threshold (beta > 0 only). A non-finite loss (first or last
    epoch of the step) is a serious G-kl-explosion firing (key `non_finite_loss`): the run stops like a collapse.
  * G-fixed-seed: more than half the groups collapse to one distinct text at temperature > 0.
  * G-verifier-format: the mean share of zero-reward-variance groups over the last `zero_var_guard_window`
    steps (fewer at the start) is at least `zero_var_guard_share` (a run that learns from almost nothing).
  * G-verifier-hang: steps where more than `reward.max_timeout_share` of the completions timed out in the
    verifier (each such completion lost its reward: it scored `reward.timeout_reward`).
  * G-verifier-error: steps where more than `reward.max_error_share` of the completions got status error
    (the checker raised: a crash that would otherwise read as "incorrect").
  * G-correction-mask: with a rollout-correction mask mode (grpo.tis_mode token_mask / sequence_mask), steps
    whose correction rejected more than `grpo.guards.correction_mask_share` of the response tokens.
  * G-teacher-kl: with on-policy distillation (grpo.distill_teacher), steps whose mean per-token reverse KL to
    the teacher exceeds `grpo.guards.teacher_kl_max`: `distill/kl_mean` with the full estimator,
    `distill/kl_k1_mean` (its unbiased estimate from the sampled tokens) with the sampled and score ones.
  * run level (guards.py `HealthMonitor` over the step history: collapse, entropy floor, reward hacking,
    KL explosion): a firing sets `health/<id>` in that step's row; a serious one stops the run.

Every firing reaches the summary's `health_firings` (and from there train/health_events.parquet, the
warehouse's `health_events` and the run report): the run-level detectors' firings, and each run of
consecutive steps with a per-step flag as one episode (first step, `last_step`, `n_steps`; source
'step_flags'), so a flag that holds for 100 steps is one event, not 100.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

import torch

from rlvr_core.experiment.config import GRPOConfig
from rlvr_core.experiment.guards import (GUARD_IDS, GUARD_KL_EXPLOSION, GUARD_NO_SIGNAL, Firing, HealthConfig,
                                         HealthMonitor, firing_dict)
from rlvr_core.environments.trajectory import to_rows
from rlvr_core.experiment.no_signal import examples
from rlvr_core.grpo.distributed import DataParallel

if TYPE_CHECKING:
    from rlvr_core.grpo.rollouts import RolloutBatch
    from rlvr_core.grpo.update import UpdateResult

__all__ = ["StepTimes", "step_flags", "zero_var_flag", "flag_episodes", "flag_line", "step_row", "rollout_sample_rows", "split_segments", "StepGuards",
           "non_finite_loss", "progress_line", "verifier_hang_line", "run_summary", "base_columns"]

NON_FINITE_LOSS = "non_finite_loss"  # the episode key (and summary tag) of a stop for a non-finite loss
STEP_FLAGS = ("G-onpolicy-ratio", "G-kl-explosion", "G-fixed-seed", "G-verifier-format", "G-verifier-hang",
              "G-verifier-error", "G-correction-mask", "G-teacher-kl")
# A multi-turn environment's per-step flags (rlvr_core/sampling/environment_engine.py `health`): in a step's flags
# (and its row's health/ columns) only when the run has such an environment, so single-turn rows stay as they were.
ENV_FLAGS = ("G-tool-errors", "G-turn-budget", "G-rerender-drift")


@dataclass
class StepTimes:
    total_s: float    # the whole step, rollout to checkpoint-ready
    rollout_s: float  # generation (all rounds and chunks) or the wait for the ahead sampler, with the weight sync
    reward_s: float   # the rest before training: verification, gathers, advantages
    train_s: float    # the update (and, with the ahead sampler, the weight snapshot)
    sync_s: float     # the weight snapshot published to the ahead sampler (0 on-policy)


def staleness(step: int, rollouts: "RolloutBatch") -> int:
    """Updates between the weights that sampled the step's rollouts and those it trains (0 on-policy)."""
    return step - rollouts.version if rollouts.version is not None else 0


def zero_var_flag(cfg: GRPOConfig, share: float, history: list[dict]) -> int:
    """G-verifier-format: 1 when the mean zero-variance group share of this step (`share`) and the up to
    window - 1 steps before it (`history`: earlier step rows) reaches `cfg.guards.zero_var_guard_share`."""
    earlier = history[max(0, len(history) - cfg.guards.zero_var_guard_window + 1):]
    shares = [r["zero_var_group_share"] for r in earlier] + [share]
    return int(sum(shares) / len(shares) >= cfg.guards.zero_var_guard_share)


def step_flags(cfg: GRPOConfig, step: int, rollouts: "RolloutBatch", upd: "UpdateResult",
               guard_tol: float, max_timeout_share: float = 0.1, history: list[dict] | None = None,
               max_error_share: float = 0.05) -> dict[str, int]:
    """The per-step guard flags (1 = fired at this step). history: the run's earlier step rows (the
    G-verifier-format window)."""
    first = upd.metrics
    uniq = [s.unique_frac for s in rollouts.stats]
    counts = rollouts.status_counts()
    return {
        # Only rollouts of the very weights being trained must give ratio 1 and the trainer's log-probs:
        # stale ones differ by design.
        "G-onpolicy-ratio": int(staleness(step, rollouts) == 0
                                and (abs(first["ratio_mean"] - 1) > cfg.guards.ratio_guard_tol
                                     or first["clip_frac"] > cfg.guards.ratio_guard_tol
                                     or first["logprob_mismatch/mean_abs"] > guard_tol)),
        "G-kl-explosion": int(upd.has_reference and first.get("kl_ref_max", 0.0) > cfg.guards.kl_spike_max),
        "G-fixed-seed": int(cfg.temperature > 0 and sum(round(u * n) == 1 for u, n in
                                                        zip(uniq, rollouts.sizes.tolist())) > rollouts.n_groups // 2),
        "G-verifier-format": zero_var_flag(cfg, rollouts.zero_var_share(), history or []),
        "G-verifier-hang": int(counts["timeout"] > max_timeout_share * sum(counts.values())),
        "G-verifier-error": int(counts["error"] > max_error_share * sum(counts.values())),
        # A mask mode that rejects most tokens trains on a minority of what was sampled (nan: no token: no flag).
        "G-correction-mask": int(cfg.tis_cap is not None and cfg.tis_mode.endswith("_mask")
                                 and first.get("tis/masked_share", 0.0) > cfg.guards.correction_mask_share),
        # On-policy distillation: the student's samples read very differently by the teacher (nan: no token). The
        # full reverse KL, or its unbiased estimate from the sampled tokens with the sampled-token estimators.
        "G-teacher-kl": int(cfg.distill_teacher is not None
                            and first.get("distill/kl_k1_mean", first.get("distill/kl_mean", 0.0))
                            > cfg.guards.teacher_kl_max),
        # A multi-turn environment's flags (its limits: the `environment:` section); absent on single-turn runs.
        **{g: int(rollouts.env[f"health/{g}"]) for g in ENV_FLAGS if rollouts.env and f"health/{g}" in rollouts.env},
    }


def flag_line(guard: str, step: int) -> str:
    """The progress line of a per-step flag episode that opens at `step` (1-based): the guard and its rule."""
    return f"flag {guard} from step {step}: {FLAG_MEANING[guard]} (one line per episode; all in health_events)"


def verifier_hang_line(step: int, rollouts: "RolloutBatch", reward: Any) -> str:
    """The progress line of a G-verifier-hang flag (`reward`: the run's RewardConfig)."""
    n = rollouts.status_counts()
    return (f"flag G-verifier-hang: {n['timeout']} of {sum(n.values())} completions timed out at step {step + 1} "
            f"(limit {reward.max_timeout_share:.0%}; each scored {reward.timeout_reward:g}, "
            f"reward.timeout_s {reward.timeout_s:g})")


def step_row(cfg: GRPOConfig, *, step: int, epoch: int, rollouts: "RolloutBatch", upd: "UpdateResult",
             times: StepTimes, flags: dict[str, int], buffer: dict[str, float] | None) -> dict[str, Any]:
    """The step's row of steps.parquet (columns: docs/grpo_training.md). buffer: the ahead sampler's
    buffer columns (`RolloutCollector.buffer_columns`), None on-policy."""
    first, b = upd.metrics, rollouts
    rewards, penalties, valid, sizes = b.rewards, b.penalties, b.valid, b.sizes
    n_drawn = int(sizes.sum())  # completions sampled this step, all rounds
    gen_tokens = sum(s.gen_tokens for s in b.stats)
    row = {
        "step": step + 1, "epoch": epoch, "lr": upd.lr, "loss": first["loss"], "pg_loss": first["pg_loss"],
        "loss_last_epoch": upd.loss_last,
        "ratio_mean": first["ratio_mean"], "ratio_max": first["ratio_max"], "ratio_min": first["ratio_min"],
        "clip_frac": first["clip_frac"], "clip_frac_low": first["clip_frac_low"],
        "clip_frac_high": first["clip_frac_high"], "approx_kl_old_new": first["approx_kl_old_new"],
        "logprob_abs_diff": first["logprob_abs_diff"],
        **{k: first[k] for k in ("logprob_mismatch/mean_abs", "logprob_mismatch/max_abs",
                                 "logprob_mismatch/share_over_tol")},
        "kl_ref_mean": first.get("kl_ref_mean", float("nan")),
        "kl_ref_max": first.get("kl_ref_max", float("nan")),
        # beta 0: how far the update moved the policy on the step's samples (NaN on steps not measured)
        "drift/kl_mean": (upd.drift or {}).get("drift/kl_mean", float("nan")),
        "drift/kl_max": (upd.drift or {}).get("drift/kl_max", float("nan")),
        "entropy": first["entropy"], "reward_mean": float(rewards[valid].mean()),
        "reward_std": float(rewards[valid].std()),
        "zero_var_group_share": b.zero_var_share(),
        "completion_len_mean": gen_tokens / n_drawn,
        "truncation_share": sum(s.truncations for s in b.stats) / n_drawn,
        "samples_per_prompt_mean": n_drawn / b.n_groups, "samples_per_prompt_max": int(sizes.max()),
        "unique_frac_mean": sum(s.unique_frac for s in b.stats) / b.n_groups,
        "grad_norm": upd.grad_norm, "n_tokens": upd.n_tokens,
        "t_rollout_s": times.rollout_s, "t_reward_s": times.reward_s, "t_train_s": times.train_s,
        "t_weight_push_s": b.push_s,
        "tokens_per_s": gen_tokens / max(times.total_s, 1e-9),
        **{f"status/{st}": n for st, n in b.status_counts().items()},
        "overlong/penalty_mean": float(penalties[valid].mean()),
        "overlong/penalized_share": float((penalties[valid] < 0).float().mean()),
        "dynamic/rounds": b.rounds, "dynamic/prompts_consumed": b.n_groups,
        "dynamic/groups_dropped": b.dropped, "dynamic/groups_kept": b.K,
        **{f"health/{g}": v for g, v in flags.items()},
    }
    if "distill/kl_mean" in first:  # on-policy distillation (grpo.distill_teacher)
        row.update({k: first[k] for k in ("distill/loss", "distill/kl_mean", "distill/kl_max", "distill/kl_k1_mean")
                    if k in first})
    if buffer is not None:
        row.update({"staleness": staleness(step, b), "t_generate_s": b.generate_s, "t_sync_s": times.sync_s,
                    **buffer})
    versions = [x.weight_version for g in b.local.values() for x in g.samples if x.weight_version is not None]
    if versions:  # engines that label samples with the weights' version (vllm-server): this rank's range
        row.update({"weight_version/min": min(versions), "weight_version/max": max(versions)})
    if b.stale is not None:  # vllm-server: stale groups dropped (and sampled again) on this rank
        row.update(b.stale)
    if b.env is not None:  # a multi-turn environment: turns, tool calls, errors, cuts, re-render drift
        row.update({k: v for k, v in b.env.items() if not k.startswith("health/")})  # its flags: from `flags`
    if cfg.adaptive_sampling:  # share of groups that got their k_success and k_failure before the cap
        enough = [s.n_correct >= cfg.adaptive_k_success and s.size - s.n_correct >= cfg.adaptive_k_failure
                  for s in b.stats]
        row["adaptive/enough_share"] = float(torch.tensor(enough).float().mean())
    if cfg.tis_cap is not None:  # rollout correction: weights, clipped and rejected shares, engine mismatch
        row.update({k: v for k, v in first.items() if k.startswith(("tis/", "mismatch/"))})
    return row


def base_columns(base: Mapping[str, Mapping[str, float]] | None, rows: list[dict], data_pos: int,
                 n_groups: int) -> dict[str, float]:
    """The base model's numbers on the prompts this step drew (curriculum positions data_pos .. data_pos +
    n_groups - 1, cycled), from the pass-rate table measured before training: `base/reward_mean` (its mean pass
    rate there), `base/truncation_share`, `base/completion_len_mean`. What G-collapse compares the step's own
    reward_mean, truncation_share and completion_len_mean with. {} without a table or when no drawn prompt is
    in it; a prompt missing from it is left out of the means."""
    if not base or not rows:
        return {}
    known = [b for b in (base.get(rows[(data_pos + k) % len(rows)]["id"]) for k in range(n_groups)) if b]
    return {f"base/{k}": sum(b[k] for b in known) / len(known)
            for k in ("reward_mean", "truncation_share", "completion_len_mean") if known and all(k in b for b in known)}


def rollout_sample_rows(cfg: GRPOConfig, dp: DataParallel, *, step: int, data_pos: int, rollouts: "RolloutBatch",
                        adv_all: torch.Tensor) -> list[dict]:
    """A sample of the trained completions for rollouts.parquet (rows on rank 0, [] on the others),
    round-robin over the trained groups (sample 0 of each, then sample 1 of each that has one, ...). Each
    rank contributes the ones it holds; rank 0 keeps them in pick order, so N ranks log exactly what one
    process logs. Collective when anything is logged."""
    b, picks = rollouts, []
    trajs = {(pid, i): t for pid, i, t in (b.trajectories or [])}
    sel_sizes = b.sizes[b.selected].tolist()
    order = [(j, i) for i in range(b.width) for j in range(b.K) if i < sel_sizes[j]]
    for k, (j, i) in enumerate(order[:cfg.rollout_samples_per_step]):
        g = b.local.get(b.selected[j])
        if g is not None:
            x, o = g.samples[i], g.outcomes[i]
            picks.append((k, {
                "step": step + 1, "position": data_pos + b.selected[j], "prompt_id": g.row["id"],
                "sample_index": x.sample_index, "prompt": g.prompt, "completion": x.text,
                "reward": float(o.reward), "status": o.status.value, "length": len(x.token_ids),
                "finish_reason": x.finish_reason, "overlong_penalty": float(b.penalties[b.selected[j], i]),
                "advantage": float(adv_all[j, i]),
                **({"segments": to_rows(trajs[g.row["id"], x.sample_index])} if trajs else {})}))
    if not (b.K and cfg.rollout_samples_per_step):
        return []
    picked = dp.gather_objects(picks)
    return [row for _, row in sorted(picked, key=lambda kv: kv[0])] if dp.is_main else []


def split_segments(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """`rollout_sample_rows` as (rollouts.parquet's rows, rollout_segments.parquet's): a multi-turn completion's
    trajectory leaves its row as one row per segment (rlvr_core.environments.trajectory.to_rows), keyed by the
    row's step, prompt id and sample index."""
    plain = [{k: v for k, v in r.items() if k != "segments"} for r in rows]
    segments = [{"step": r["step"], "prompt_id": r["prompt_id"], "sample_index": r["sample_index"], **seg}
                for r in rows for seg in r.get("segments", ())]
    return plain, segments


# What each per-step flag says, for the reason of its episodes (step_flags has the exact rules).
FLAG_MEANING = {
    "G-onpolicy-ratio": "on-policy ratio off 1, clipping or rollout/trainer log-prob mismatch",
    "G-kl-explosion": "max token KL to the reference above grpo.guards.kl_spike_max",
    "G-fixed-seed": "more than half the groups sampled one distinct completion at temperature > 0",
    "G-verifier-format": "zero-reward-variance groups at or above grpo.guards.zero_var_guard_share over the window",
    "G-verifier-hang": "verifier timeouts above reward.max_timeout_share of the completions",
    "G-verifier-error": "verifier errors (the checker raised) above reward.max_error_share of the completions",
    "G-correction-mask": "rollout correction rejected more than grpo.guards.correction_mask_share of the tokens",
    "G-teacher-kl": "mean reverse KL to the distillation teacher above grpo.guards.teacher_kl_max",
    "G-tool-errors": "tool calls that failed (malformed, error, timeout) above environment.max_tool_error_share",
    "G-turn-budget": "trajectories cut by a budget above environment.max_cut_share",
    "G-rerender-drift": "trajectories whose ids decode and encode to other ids above environment.max_rerender_drift",
}


def replayed_flags(row: dict, cfg: GRPOConfig | None) -> dict[str, int]:
    """A written step row's per-step flags. Its health/G-kl-explosion may also be the run-level KL detector's
    mark, so that flag is recomputed from kl_ref_max (NaN without a reference: never)."""
    present = [g for g in ENV_FLAGS if f"health/{g}" in row]  # a multi-turn run's rows only
    flags = {g: int(row.get(f"health/{g}", 0)) for g in (*STEP_FLAGS, *present)}
    if cfg is not None:
        flags["G-kl-explosion"] = int(row.get("kl_ref_max", float("nan")) > cfg.guards.kl_spike_max)
    return flags


def flag_episodes(flagged: dict[str, list[int]]) -> list[dict]:
    """Runs of consecutive flagged steps, per guard, as health events (firing_dict's keys plus last_step,
    n_steps, source 'step_flags'), ordered by first step."""
    out = []
    for g, steps in flagged.items():
        runs: list[list[int]] = []
        for st in steps:
            if runs and st == runs[-1][-1] + 1:
                runs[-1].append(st)
            else:
                runs.append([st])
        out += [{"guard_id": g, "step": r[0], "last_step": r[-1], "n_steps": len(r), "serious": False,
                 "reason": (f"{g}: step {r[0]}" if len(r) == 1 else f"{g}: steps {r[0]}-{r[-1]} ({len(r)} steps)")
                           + f": {FLAG_MEANING[g]}",
                 "evidence": {"first_step": r[0], "last_step": r[-1], "n_steps": len(r)},
                 "key": "step-flag", "source": "step_flags"} for r in runs]
    return sorted(out, key=lambda f: (f["step"], f["guard_id"]))


class StepGuards:
    """Guard bookkeeping of a run: counts per guard id (the summary's `health/<id>`), the run-level
    detectors over the step history (collapse, entropy floor, reward hacking, KL explosion; guards.py) and
    the non-finite-loss stop, their firings and the steps each per-step flag fired at. A resumed run replays
    its history first (its rows hold those flags already), so `firings` covers the whole run, not only this call."""

    def __init__(self, step_rows: list[dict], health: HealthConfig | None = None, cfg: GRPOConfig | None = None):
        self.counts = {g: 0 for g in (*STEP_FLAGS, *GUARD_IDS)}
        for r in step_rows:
            for g in (*self.counts, *(e for e in ENV_FLAGS if f"health/{e}" in r)):
                self.counts[g] = self.counts.get(g, 0) + int(r.get(f"health/{g}", 0))
        self.health = HealthMonitor(health or HealthConfig())
        self._firings = [firing_dict(f) for f in self.health.update(step_rows)]
        self.flagged: dict[str, list[int]] = {g: [] for g in STEP_FLAGS}  # + a multi-turn run's ENV_FLAGS
        for r in step_rows:
            self._mark(r["step"], replayed_flags(r, cfg))
        self._step = step_rows[-1]["step"] if step_rows else 0
        self.unextracted: list[str] = []  # the newest completions whose answer the verifier could not extract

    def note_unextracted(self, rollouts: "RolloutBatch", keep: int = 2) -> None:
        """Keep up to `keep` of this step's completions with status no_answer (this rank's groups), for
        G-no-signal's cause: the outputs a verifier that never matches could not read."""
        found = [x.text for g in rollouts.local.values() for x, o in zip(g.samples, g.outcomes)
                 if o.status.value == "no_answer"][:keep]
        if found:
            self.unextracted = found

    def _explained(self, f: Firing) -> Firing:
        """A G-no-signal firing that blames the verifier, with the unextracted outputs quoted."""
        if f.guard_id != GUARD_NO_SIGNAL or f.evidence.get("cause") != "verifier" or not self.unextracted:
            return f
        return dataclasses.replace(f, reason=f"{f.reason}; unextracted outputs: {examples(self.unextracted)}",
                                   evidence={**f.evidence, "examples": list(self.unextracted)})

    def _mark(self, step: int, flags: dict[str, int]) -> None:
        for g, v in flags.items():
            if v:
                self.flagged.setdefault(g, []).append(step)

    def count(self, flags: dict[str, int], step: int | None = None) -> list[str]:
        """Add a step's per-step flags (`step`: its 1-based number; None = the step after the last one). Returns
        the guards whose flag episode opens at this step (flagged now, not at the step before), for the one
        terminal line each episode gets (`flag_line`)."""
        for g, v in flags.items():
            self.counts[g] = self.counts.get(g, 0) + v
        prev = self._step
        self._step = self._step + 1 if step is None else step
        opened = [g for g, v in flags.items() if v and not (self.flagged.get(g) and self.flagged[g][-1] == prev)]
        self._mark(self._step, flags)
        return opened

    @property
    def firings(self) -> list[dict]:
        """Every event of the run so far: the run-level firings and the per-step flag episodes, by step."""
        return sorted(self._firings + flag_episodes(self.flagged), key=lambda f: f["step"])

    def check(self, step_rows: list[dict], say: Callable[[str], None]) -> list[Firing]:
        """Run the detectors after the newest row was appended; mark their firings in it. Returns the
        serious ones (the caller stops the run)."""
        row = step_rows[-1]
        for g in GUARD_IDS:
            row.setdefault(f"health/{g}", 0)
        new = [self._explained(f) for f in self.health.update(step_rows)]  # this step's, once per episode
        new += non_finite_loss(row)
        for f in new:
            say(("STOP " if f.serious else "flag ") + f.reason)
            if not row[f"health/{f.guard_id}"]:  # G-kl-explosion may be set by the per-step flag already
                row[f"health/{f.guard_id}"] = 1
                self.counts[f.guard_id] += 1
            self._firings.append(firing_dict(f))
        return [f for f in new if f.serious]


def non_finite_loss(row: dict) -> list[Firing]:
    """A serious G-kl-explosion firing when the step's loss (first or last epoch) is NaN or infinite: the
    update diverged, and training on (or checkpointing) the weights it left behind would spread the damage."""
    bad = {k: row[k] for k in ("loss", "loss_last_epoch") if k in row and not math.isfinite(row[k])}
    if not bad:
        return []
    step = row["step"]
    reason = (f"{GUARD_KL_EXPLOSION} at step {step}: non-finite loss ("
              + ", ".join(f"{k} {v}" for k, v in bad.items()) + "): the update diverged")
    # NaN and inf as text: the evidence goes to JSON (the summary, health_events), which has neither.
    return [Firing(GUARD_KL_EXPLOSION, step, True, reason, {k: str(v) for k, v in bad.items()}, NON_FINITE_LOSS)]


def progress_line(row: dict, steps: int, seconds: float) -> str:
    return (f"step {row['step']}/{steps} reward {row['reward_mean']:.3f} loss {row['loss']:+.4f} "
            f"ratio {row['ratio_mean']:.4f} len {row['completion_len_mean']:.1f} lr {row['lr']:.2e} "
            f"({seconds:.2f}s)" + "".join(f" {k} {v:.3f}" for k, v in row.items() if k.startswith("eval/")))


def run_summary(rows: list[dict], cfg: GRPOConfig, guards: dict[str, int], done: bool, wall_s: float,
             start_step: int) -> dict[str, Any]:
    if not rows:
        return {"steps": 0, "done": done, "wall_s": wall_s, "guards": guards}

    def mean(key: str, part: list[dict]) -> float:
        return sum(r[key] for r in part) / len(part)

    k = max(1, min(10, len(rows) // 4))
    t = {p: sum(r[f"t_{p}_s"] for r in rows) for p in ("rollout", "reward", "train")}
    total = sum(t.values())
    return {
        "steps": rows[-1]["step"], "done": done, "resumed_from_step": start_step,
        "first_reward_mean": rows[0]["reward_mean"], "last_reward_mean": rows[-1]["reward_mean"],
        f"first{k}_reward_mean": mean("reward_mean", rows[:k]), f"last{k}_reward_mean": mean("reward_mean", rows[-k:]),
        "tokens_per_s": sum(r["tokens_per_s"] * (r["t_rollout_s"] + r["t_reward_s"] + r["t_train_s"])
                            for r in rows) / max(total, 1e-9),
        "time_split_s": {**{p: round(v, 3) for p, v in t.items()}, "total_steps": round(total, 3)},
        "time_split_frac": {p: round(v / max(total, 1e-9), 3) for p, v in t.items()},
        "wall_s_this_call": round(wall_s, 3),
        "guards": {f"health/{g}": n for g, n in guards.items()},
        "config": cfg.model_dump(),
    }
