"""The GRPO training stage: rollouts on the live policy, verifier rewards, group advantages, DeepSpeed steps.

`train_grpo(base_model_dir, train_rows, curriculum_ids, out_dir, cfg, ...)` is the whole stage. This module
owns the loop and reads top to bottom, one step at a time; each phase lives in its own module, and the
maths in the pure functions next door (advantages.py, losses.py, kl.py), which they only call. One step:

  1. collect (rollouts.py): the next P curriculum ids (cycled; from the data position, step * P unless
     dynamic sampling consumed more), rows looked up by id (an id with no row fails before any work,
     G-id-mismatch). The rollout engine (rollout_engine.py: `make_rollout_engine(engine)`, "hf" by default)
     samples G completions per prompt with per-request seeds derived from (seed, prompt id, epoch, step,
     sample index) (G-fixed-seed) and returns each sampled token's RAW (temperature-1) log-prob: the old
     log-probs. On-policy the engine is synced with the policy's current weights first; with
     `max_staleness` s > 0 step t's rollouts were sampled ahead, in a thread, by the engine holding the
     weights after max(0, t - s) updates (ahead.py; the trainer publishes `snapshot`s every step). With
     `adaptive_sampling` a prompt gets further chunks of G until it has k_success correct and k_failure
     other completions, or a cap.
  2. reward (rollouts.py): the `reward:` section's VerifierPool (worker processes for verifiers that can hang)
     scores each completion against the gold, optionally plus DAPO's soft overlong penalty
     (`overlong_buffer_len`). With `dynamic_sampling` (DAPO) groups whose rewards are all equal are dropped
     and rounds of the next P prompts are sampled until P groups are kept or `dynamic_sampling_max_rounds` is
     reached (the batch is then trained short, G-partial-batch).
     The result is a `RolloutBatch`: this rank's groups plus every group's numbers, gathered from all ranks.
  3. advantages: registered estimator `cfg.advantage` over the (K, G) reward matrix of the trained groups
     (K = P unless dynamic sampling ran out of rounds; ragged groups under adaptive sampling go flat).
  4. update (update.py): teacher-forced forward over prompt + completion tokens (tokenized as the engine
     tokenized them, masks from lengths, G-pad-mask), log_softmax at temperature 1, optional reference
     log-probs (beta > 0), `grpo_loss` (with `tis_cap`: truncated importance sampling against the engine's
     log-probs; with `distill_teacher`: the teacher's log-probs, on CPU or from its vLLM servers, and the
     reverse KL to them mixed in, distillation.py), DeepSpeed backward/step for `epochs_per_step` epochs
     (`ds_config`: AdamW, warm-up + cosine, grad clipping, ZeRO stage). With staleness the new weights are
     published to the ahead sampler.
  5. metrics (step_metrics.py): one row of steps.parquet per step (rollout statistics, loss/ratio/entropy,
     the rollout-vs-trainer log-prob mismatch `logprob_mismatch/*`, verifier `status/*` counts with errors
     and timeouts visible (G-verifier-error), timings), and `rollout_samples_per_step` completions for
     rollouts.parquet; `evaluate` every `eval_every` steps and after the last (`eval_every: auto`: ~10 points).
  6. guards (step_metrics.py, guards.py): per-step flags (G-onpolicy-ratio, G-kl-explosion, G-fixed-seed,
     G-verifier-format, G-verifier-hang, G-verifier-error, G-correction-mask, G-teacher-kl; G-logprob-temp stops
     the run at step 1) and the run-level HealthMonitor, and the non-finite-loss stop (G-kl-explosion); a
     serious firing stops every rank with GuardError and a summary tagged `collapsed`, before the step is
     counted or checkpointed.
  7. checkpoint (checkpointing.py): DeepSpeed checkpoint every `checkpoint_every` steps and at the end of
     the call, with step, data position and rows; a call whose out_dir holds one resumes there.

Data parallel: under `torchrun --nproc_per_node N` or the `deepspeed` launcher each rank takes a
contiguous 1/N of the step's prompts (P must divide), samples them with the seeds a single process would
use, normalises its loss by the global token/sequence count, and all-reduces the metrics, so N ranks
train exactly like one process with the same P x G batch (distributed.py has the details). Only rank 0
writes files, evaluates and reports progress; checkpoints are collective.

DeepSpeed on CPU needs the five torch.distributed variables and a C++ op JIT-compiled once (~35 s;
cached in TORCH_EXTENSIONS_DIR, which defaults to the project's `$RLVR_HOME/torch_extensions`);
`_ensure_launch_env` sets what no launcher set (a single process). ZeRO 0/1/2/3 run on CPU with gloo.

`python -m rlvr_core.grpo.trainer --base DIR --out DIR` reproduces docs/grpo_training.md: build the
curriculum from the base model's pass rates, train, evaluate base and trained model greedily on the
held-out split.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
import yaml

from rlvr_core.core.settings import paths
from rlvr_core.data.curriculum import filter_by_pass_rate, order_curriculum, pass_rate_table
from rlvr_core.data.synthetic import SyntheticSpec, make_synthetic_dataset
from rlvr_core.data.templates import get_template
from rlvr_core.experiment.config import GRPOConfig, RewardConfig, apply_overrides
from rlvr_core.experiment.guards import Firing, GuardError, HealthConfig
from rlvr_core.grpo.advantages import get_advantage, weight_negative_advantages
from rlvr_core.artifacts.layout import ROLLOUTS_FILE, STEPS_FILE, SUMMARY_FILE
from rlvr_core.grpo.checkpointing import (CHECKPOINTS, FINAL_MODEL, RunState, resume, save_checkpoint, save_final_model,
                                          write_lora_config, write_rollouts, write_rows)
from rlvr_core.grpo.distributed import check_divisible, launch_world_size, shutdown
from rlvr_core.grpo.distillation import LocalTeacher, ServerTeacher, checked_teacher, load_teacher
from rlvr_core.grpo.losses import grpo_loss
from rlvr_core.grpo.rollout_engine import RolloutEngine, check_rollout_engine, make_rollout_engine
from rlvr_core.sampling.environment_engine import with_environment
from rlvr_core.grpo.rollouts import RolloutBatch, RolloutCollector
from rlvr_core.grpo.step_metrics import (NON_FINITE_LOSS, StepGuards, StepTimes, base_columns, flag_line, run_summary,
                                         progress_line, rollout_sample_rows, split_segments, step_flags, step_row,
                                         verifier_hang_line)
from rlvr_core.grpo.policy import Policy, build_policy, load_policy_model
from rlvr_core.grpo.update import sampled_kl, train_inputs, update_policy
# (get_advantage, grpo_loss and launch_world_size above are looked up in this module at call time, so a test may
# monkeypatch them here.)
from rlvr_core.sampling.models import load_model
from rlvr_core.sampling.verified import sample_and_verify
from rlvr_core.verifiers.pool import VerifierPool
from rlvr_core.core.net import free_port

__all__ = ["GRPOResult", "train_grpo", "rows_for_curriculum"]


@dataclass
class GRPOResult:
    final_model_dir: Path      # save_pretrained of the trained policy + tokenizer (from_pretrained-loadable)
    steps_path: Path           # Parquet, one row per step (metrics listed in docs/grpo_training.md)
    checkpoints_dir: Path      # DeepSpeed checkpoints (tag step<N>, `latest` file)
    summary: dict[str, Any] = field(default_factory=dict)
    rollouts_path: Path | None = None  # Parquet, rollout_samples_per_step completions per step (docs)


# ------------------------------------------------------------------------------------------- environment
def _ensure_launch_env() -> list[str]:
    """What a launcher (torchrun, deepspeed) would have exported, for a single process started without one:
    DeepSpeed needs all five variables or it falls back to MPI discovery (STACK.md). A launcher's values
    are never overwritten. Returns the launcher variables it added (see `train_grpo`)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    # The ~35 s op compile is paid once per cache; point it at the project's cache, not ~/.cache.
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(paths().torch_extensions))
    added = []
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                 ("MASTER_PORT", None)):
        if k not in os.environ:
            os.environ[k] = v if v is not None else str(free_port())
            added.append(k)
    return added


def rows_for_curriculum(train_rows: list[dict], curriculum_ids: list[str]) -> list[dict]:
    """Rows in curriculum order; any id without a row fails loudly with the count and examples."""
    by_id = {r["id"]: r for r in train_rows}
    missing = [i for i in curriculum_ids if i not in by_id]
    if missing:
        raise KeyError(f"{len(missing)} of {len(curriculum_ids)} curriculum ids have no training row "
                       f"(G-id-mismatch), e.g. {missing[:5]}")
    if not curriculum_ids:
        raise ValueError("empty curriculum: nothing to train on")
    return [by_id[i] for i in curriculum_ids]


# ------------------------------------------------------------------------------------------- the stage
def train_grpo(base_model_dir: str | Path, train_rows: list[dict], curriculum_ids: list[str], out_dir: Path,
               cfg: GRPOConfig, *, template_id: str, reward: RewardConfig, max_new_tokens: int, seed: int,
               progress: Callable[[str], None] | None = None,
               stop_after_steps: int | None = None,
               evaluate: Callable[[Any, Any], dict[str, float]] | None = None, engine: str = "hf",
               engine_options: dict | None = None, on_step: Callable[[dict], None] | None = None,
               base_eval: dict[str, float] | None = None,
               base_rollouts: Mapping[str, Mapping[str, float]] | None = None,
               on_rollouts: Callable[[dict, RolloutBatch], None] | None = None,
               environment: Any = None, passrate_temperature: float | None = None) -> GRPOResult:
    """Train the policy in `base_model_dir` with GRPO on the curriculum; see the module docstring.

    Resumes from `out_dir/checkpoints` when it holds a checkpoint. `stop_after_steps` ends this call
    after that many steps (counted from the resume point) with a checkpoint, as if the job were
    killed; a second call resumes. `evaluate(model, tokenizer) -> {name: value}` is called every
    `cfg.eval_every` steps and after the last one (G-no-eval); its values land in that step's row as
    `eval/<name>`. `engine` names the rollout engine (rollout_engine.py: "hf" or "vllm"), `engine_options`
    its settings (vllm: `vllm.LLM` overrides, see `rlvr_core.sampling.vllm.llm_options`). `on_step(row)` gets
    each finished step's row of steps.parquet on rank 0 (guard flags set), e.g. a
    `rlvr_core.records.tracking.StepMetricsSink` that sends it to MLflow while training runs; `on_rollouts(row,
    rollouts)` gets the same row with the step's RolloutBatch (rank 0's groups), e.g. a
    `rlvr_core.pipeline.traces.TraceSink` that writes sampled groups as MLflow traces. Returns a GRPOResult;
    `final_model_dir` exists only when all `cfg.steps` steps are done. `reward` says how completions are scored
    (verifier, mode, worker processes, time limit, what a timeout scores, the G-verifier-hang threshold).
    `environment` (the config's `environment:` section; None or single_turn: one completion per prompt) makes every
    rollout a multi-turn trajectory (rlvr_core/sampling/environment_engine.py): the loss sees only the policy's ids.
    `base_eval` ({name: value} of the base model, on what `evaluate` scores) is G-reward-hacking's reference
    point; without it the first eval point is. `base_rollouts` ({prompt id: {"reward_mean", "truncation_share",
    "completion_len_mean"}}, the pass-rate table's numbers for the base model) gives every step row the base's
    numbers on the prompts that step drew (`base/*` columns), G-collapse's baselines from the first step.

    Under a launcher every rank calls this with the same arguments; P must be divisible by the world
    size. Rank 0 alone calls `progress` and `evaluate` and writes steps/summary/final model; every rank
    returns once they exist (the summary is rank 0's; other ranks' rows lack the eval values).
    """
    run = _setup(base_model_dir, train_rows, curriculum_ids, Path(out_dir), cfg, template_id=template_id,
                 reward=reward, max_new_tokens=max_new_tokens, seed=seed,
                 progress=progress, stop_after_steps=stop_after_steps, evaluate=evaluate, engine=engine,
                 engine_options=engine_options, base_eval=base_eval, environment=environment,
                 passrate_temperature=passrate_temperature)
    run.base_rollouts = base_rollouts
    policy, state, dp, say = run.policy, run.state, run.policy.dp, run.say
    ahead, step = None, state.start_step
    try:
        if cfg.max_staleness and state.start_step < run.last_step:
            ahead = run.collector.start_ahead(first_step=state.start_step, last_step=run.last_step,
                                              data_pos=state.data_pos, saved=state.ahead_weights,
                                              current=_snapshot(run))
        for step in range(state.start_step, run.last_step):
            t0 = time.perf_counter()
            epoch = state.data_pos // len(run.rows)
            # 1-2. collect + reward: this rank's groups, sampled and verified; every group's numbers gathered
            rollouts = run.collector.collect(step, state.data_pos)
            run.guards.note_unextracted(rollouts)  # G-no-signal quotes them when the verifier reads no answer
            # 3. advantages over the trained groups, identical on every rank (each keeps its own rows)
            adv_all = _advantages(cfg, rollouts)
            t2 = time.perf_counter()
            # 4. update: epochs_per_step DeepSpeed steps on this rank's trained completions
            upd, kl_sampled, t_sync = _update(run, rollouts, adv_all, step, ahead)
            t3 = time.perf_counter()
            # 5. metrics: the step row (same on every rank), the rollout sample, the evaluate hook
            times = StepTimes(t3 - t0, rollouts.t_rollout_s, t2 - t0 - rollouts.t_rollout_s, t3 - t2, t_sync)
            row = _step_row(run, step, epoch, rollouts, adv_all, upd, kl_sampled, times, ahead)
            state.step_rows.append(row)
            # 6. guards: the run-level detectors; one stop decision for every rank (eval/* exist on rank 0 only)
            serious = run.guards.check(state.step_rows, say)
            if on_step is not None and dp.is_main:
                on_step(row)  # the row is final now (guard flags set): live metrics (docs/tracking.md)
            if on_rollouts is not None and dp.is_main:
                on_rollouts(row, rollouts)  # rollout traces (docs/tracking.md); copies what it keeps, sends later
            if dp.max([float(bool(serious))])[0] > 0:
                _stop_collapsed(run, serious, step)  # before the data position moves and any checkpoint
            state.data_pos += rollouts.n_groups  # every prompt sampled is consumed, kept or not
            say(progress_line(row, cfg.steps, t3 - t0))
            # 7. checkpoint
            if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == run.last_step:
                save_checkpoint(policy.engine, run.out_dir, step + 1, state, ahead, is_main=dp.is_main)
    except GuardError as err:
        # A stop raised inside a phase (G-logprob-temp at step 1, G-weight-push) leaves the same record as a
        # run-level detector's stop (_stop_collapsed writes its own before raising).
        if not isinstance(err, RecordedGuardError):
            _write_stopped(run, [_raised_firing(err, step + 1)], step)
        raise
    finally:
        run.close()
    return _finish(run)


def _raised_firing(err: GuardError, step: int) -> Firing:
    """A serious firing for a GuardError raised inside a phase: its guard id (the error's `guard` field, else the
    G-id its message starts with), the step it stopped and its message."""
    guard = getattr(err, "guard", None)
    if not guard:
        head = str(err).split(":", 1)[0].split()
        guard = head[0] if head and head[0].startswith("G-") else "guard"
    return Firing(guard, getattr(err, "step", None) or step, True, str(err).splitlines()[0] if str(err) else guard,
                  {}, "raised")


@dataclass
class _Run:
    """One call's set-up: everything the loop uses besides the step counter."""

    cfg: GRPOConfig
    out_dir: Path
    rows: list[dict]                 # curriculum rows, in order
    tok: Any
    policy: Policy
    rollout_engine: RolloutEngine
    pool: Any                        # VerifierPool
    reward: RewardConfig
    collector: RolloutCollector
    state: RunState
    guards: StepGuards
    last_step: int                   # this call trains steps state.start_step .. last_step - 1
    norm_len: int | None             # seq-mean-token-sum-norm's constant (max_new_tokens)
    guard_tol: float                 # G-logprob-temp / log-prob mismatch tolerance
    say: Callable[[str], None]       # progress on rank 0, nothing elsewhere
    evaluate: Callable[[Any, Any], dict[str, float]] | None
    t_start: float
    base_rollouts: Mapping[str, Mapping[str, float]] | None = None  # the base model's numbers per prompt id
    teacher: Any = None              # on-policy distillation's teacher (grpo.distill_teacher): Local/ServerTeacher

    def close(self) -> None:
        self.pool.close()
        self.collector.close()  # stops the ahead sampler's thread, if any
        self.rollout_engine.close()
        if self.teacher is not None:
            self.teacher.close()


def _setup(base_model_dir, train_rows, curriculum_ids, out_dir: Path, cfg: GRPOConfig, *, template_id: str,
           reward: RewardConfig, max_new_tokens: int, seed: int, progress, stop_after_steps,
           evaluate, engine: str, engine_options: dict | None, base_eval: dict[str, float] | None = None,
           environment: Any = None, passrate_temperature: float | None = None) -> _Run:
    """Check the request and start the verifier pool (before any work), then `_load` the rest."""
    t_start = time.perf_counter()
    rows = rows_for_curriculum(train_rows, list(curriculum_ids))
    P = cfg.prompts_per_step
    if P > len(rows):
        # The engine refuses repeated prompt ids in one call (they would share seeds).
        raise ValueError(f"prompts_per_step={P} exceeds the curriculum's {len(rows)} prompts")
    if cfg.overlong_buffer_len > max_new_tokens:
        raise ValueError(f"overlong_buffer_len={cfg.overlong_buffer_len} exceeds max_new_tokens={max_new_tokens}: "
                         "the penalty window must lie inside the generation cap")
    check_rollout_engine(engine)
    teacher_dir = _teacher_dir(cfg, base_model_dir, out_dir)  # a teacher the student cannot share: refused now
    # Before the model loads: a bad verifier name or mode fails here. Workers start now and warm up while
    # the policy loads.
    pool = VerifierPool(reward.verifier, reward.pool_options(), workers=reward.workers, timeout_s=reward.timeout_s)
    try:
        return _load(base_model_dir, rows, out_dir, cfg, template_id=template_id, reward=reward, pool=pool,
                     max_new_tokens=max_new_tokens, seed=seed, progress=progress, stop_after_steps=stop_after_steps,
                     evaluate=evaluate, engine=engine, engine_options=engine_options, t_start=t_start,
                     health=run_health(cfg, base_eval, reward, passrate_temperature), environment=environment,
                     teacher_dir=teacher_dir)
    except BaseException:
        pool.close()
        raise


def _load(base_model_dir, rows: list[dict], out_dir: Path, cfg: GRPOConfig, *, template_id: str,
          reward: RewardConfig, pool: Any, max_new_tokens: int, seed: int, progress, stop_after_steps, evaluate,
          engine: str, engine_options: dict | None, t_start: float, health: HealthConfig,
          environment: Any = None, teacher_dir: Path | None = None) -> _Run:
    """The expensive half of `_setup`: the policy under DeepSpeed, its resume state, the rollout side."""
    from transformers import AutoTokenizer

    P = cfg.prompts_per_step
    added_env = _ensure_launch_env()
    world = launch_world_size()
    check_divisible(P, world)
    (out_dir / CHECKPOINTS).mkdir(parents=True, exist_ok=True)
    template = get_template(template_id)
    tok = AutoTokenizer.from_pretrained(base_model_dir, local_files_only=True)
    policy = build_policy(base_model_dir, cfg, seed, batch_size=P * cfg.group_size, world=world, added_env=added_env)
    dp = policy.dp
    if cfg.lora_rank and dp.is_main:
        write_lora_config(policy.module, out_dir / CHECKPOINTS)
    # Ranks > 0 compute the same step rows as rank 0 but never report or write them.
    say = (progress or (lambda _msg: None)) if dp.is_main else (lambda _msg: None)
    state = resume(policy.engine, out_dir, cfg, policy.device, is_main=dp.is_main)
    if state.resumed_from is not None:
        say(f"resumed from {state.resumed_from} at step {state.start_step}")
    if engine == "vllm-server":  # the weight versions and started servers' logs go into the run's folder
        engine_options = {"out_dir": out_dir, **(engine_options or {})}
    rollout_engine = make_rollout_engine(engine, base_model_dir=base_model_dir, tokenizer=tok, cfg=cfg,
                                         device=policy.device, seed=seed, policy=policy.module,
                                         replica=policy.replica,
                                         own_copy=lambda: load_policy_model(base_model_dir, cfg, seed),
                                         engine_options=engine_options,
                                         lockstep=(lambda n: int(dp.max([float(n)])[0])) if policy.lockstep else None)
    if environment is not None and environment.multi_turn:  # every rollout a multi-turn trajectory
        rollout_engine.sampler = with_environment(environment, rollout_engine.sampler, template)
    collector = RolloutCollector(cfg, rows=rows, template=template, engine=rollout_engine, pool=pool, dp=dp,
                                 max_new_tokens=max_new_tokens, seed=seed, weights=policy.current_weights,
                                 timeout_reward=reward.timeout_reward,
                                 lockstep=policy.lockstep and getattr(rollout_engine, "samples_policy", False))
    teacher = None
    if cfg.distill_teacher_servers:
        teacher = ServerTeacher(cfg.distill_teacher_servers, cfg.distill_estimator)
    elif teacher_dir is not None:
        head = policy.module.get_output_embeddings().weight
        width = int(getattr(head, "ds_shape", head.shape)[0])  # ZeRO-3: the full width
        teacher = LocalTeacher(load_teacher(teacher_dir, width), cfg.distill_estimator)
    if teacher is not None:
        say(f"distilling from the teacher in {teacher_dir} ({teacher.where}; weight {cfg.distill_weight:g}, "
            f"{cfg.distill_estimator} KL)")
    return _Run(cfg, out_dir, rows, tok, policy, rollout_engine, pool, reward, collector, state,
                StepGuards(state.step_rows, health, cfg),
                cfg.steps if stop_after_steps is None else min(cfg.steps, state.start_step + stop_after_steps),
                max_new_tokens if cfg.loss_agg == "seq-mean-token-sum-norm" else None,
                cfg.guards.logprob_guard_tol or (1e-3 if cfg.precision == "fp32" else 5e-2), say, evaluate, t_start,
                teacher=teacher)


def _teacher_dir(cfg: GRPOConfig, base_model_dir, out_dir: Path) -> Path | None:
    """On-policy distillation's teacher folder, refused before anything loads where the student cannot use it
    (distillation.py `checked_teacher`); None without `grpo.distill_teacher`."""
    if cfg.distill_teacher is None:
        return None
    # Each rank its own copy of a run's export: ranks start together, and none may read a half-written folder.
    rank = os.environ.get("RANK", "0")
    cache = out_dir / "teacher" / (f"rank{rank}" if launch_world_size() > 1 else "")
    return checked_teacher(cfg, base_model_dir, cache)


def run_health(cfg: GRPOConfig, base_eval: dict[str, float] | None, reward: RewardConfig | None = None,
               passrate_temperature: float | None = None) -> HealthConfig:
    """The run-level detectors' settings: `grpo.guards.health`, with the base model's evaluation as G-reward-hacking's
    reference unless the config names one itself, and the settings G-no-signal's cause names (verifier, mode, the
    rollouts' and the pass-rate table's temperatures)."""
    health = cfg.guards.health
    if base_eval and health.reward_hacking.base_eval is None:
        health = health.model_copy(update={"reward_hacking": health.reward_hacking.model_copy(
            update={"base_eval": {k: float(v) for k, v in base_eval.items()}})})
    ns = health.no_signal
    return health.model_copy(update={"no_signal": ns.model_copy(update=dict(
        verifier=ns.verifier or (reward.verifier if reward else None),
        verifier_mode=ns.verifier_mode or (reward.mode if reward else None),
        temperature=cfg.temperature if ns.temperature is None else ns.temperature,
        passrate_temperature=passrate_temperature if ns.passrate_temperature is None else ns.passrate_temperature))})


def _group_advantages(name: str, rewards: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Advantages of the registered estimator `name` for (K, M) rewards whose groups fill the slots where
    `valid` is True (a prefix of each row); (K, M), 0 in the empty slots. Groups of one size are one (K, M)
    call; ragged groups (adaptive sampling) go to the estimator flat, with group ids."""
    fn = get_advantage(name)
    if bool(valid.all()):
        return fn(rewards)
    gid = torch.arange(rewards.shape[0]).repeat_interleave(valid.sum(1))
    out = torch.zeros_like(rewards)
    out[valid] = fn(rewards[valid], group_ids=gid)
    return out


def _update(run: _Run, rollouts: RolloutBatch, adv_all: torch.Tensor, step: int, ahead) -> tuple[Any, bool, float]:
    """One step's policy update on this rank's trained completions: (its result, whether the KL to the
    reference was measured on the samples because nothing was trained, the weight-sync seconds)."""
    policy, cfg = run.policy, run.cfg
    inputs = train_inputs(rollouts, adv_all, tokenizer=run.tok, sampler=run.rollout_engine.sampler,
                          device=policy.device)
    upd = update_policy(policy, cfg, inputs, loss_fn=grpo_loss, step=step, norm_len=run.norm_len,
                        guard_tol=run.guard_tol, teacher=run.teacher)
    kl_sampled = upd.has_reference and upd.n_tokens == 0
    if kl_sampled:  # nothing trained: the KL to the reference of what was sampled
        upd.metrics.update(sampled_kl(policy, cfg, rollouts, tokenizer=run.tok,
                                      sampler=run.rollout_engine.sampler, device=policy.device))
    t_sync = 0.0
    if ahead is not None:
        # The weight sync: the version this step made, for the step that samples with it (collective
        # under ZeRO-3: every rank gathers, like the on-policy refresh it replaces). Part of train time.
        ts = time.perf_counter()
        ahead.publish(step + 1, _snapshot(run))
        t_sync = time.perf_counter() - ts
    return upd, kl_sampled, t_sync


def _step_row(run: _Run, step: int, epoch: int, rollouts: RolloutBatch, adv_all: torch.Tensor, upd,
              kl_sampled: bool, times: StepTimes, ahead) -> dict:
    """The step's row of steps.parquet (guard flags counted, the rollout sample kept, the evaluate hook run)."""
    cfg, state = run.cfg, run.state
    flags = step_flags(cfg, step, rollouts, upd, run.guard_tol, max_timeout_share=run.reward.max_timeout_share,
                       history=state.step_rows, max_error_share=run.reward.max_error_share)
    for guard in run.guards.count(flags, step + 1):  # one line when a flag's episode opens, not one per step
        run.say(verifier_hang_line(step, rollouts, run.reward) if guard == "G-verifier-hang" else
                flag_line(guard, step + 1))
    picked, segments = split_segments(rollout_sample_rows(cfg, run.policy.dp, step=step, data_pos=state.data_pos,
                                                          rollouts=rollouts, adv_all=adv_all))
    state.rollout_rows += picked
    state.segment_rows += segments
    row = step_row(cfg, step=step, epoch=epoch, rollouts=rollouts, upd=upd, times=times, flags=flags,
                   buffer=run.collector.buffer_columns() if ahead is not None else None)
    row.update(base_columns(run.base_rollouts, run.rows, state.data_pos, rollouts.n_groups),
               kl_ref_from_samples=int(kl_sampled))
    _evaluate(run, row, step)
    return row


def _advantages(cfg: GRPOConfig, rollouts: RolloutBatch) -> torch.Tensor:
    """(K, M) advantages of the trained groups (row j = rollouts.selected[j]), 0 in empty slots. The estimator
    sees the trained groups' shaped rewards (verifier reward + overlong penalty), as in one process."""
    shaped = rollouts.rewards + rollouts.penalties if cfg.overlong_buffer_len > 0 else rollouts.rewards
    sel = rollouts.selected
    if sel:
        adv = _group_advantages(cfg.advantage, shaped[sel], rollouts.valid[sel])
    else:
        adv = torch.zeros((0, rollouts.width))
    return weight_negative_advantages(adv, cfg.negative_advantage_weight)


def _snapshot(run: _Run) -> dict[str, torch.Tensor]:
    """The policy's current weights as the rollout engine's `load` takes them (every rank: under ZeRO-3 a
    collective gather into a transient full copy on each rank, which the ahead sampler needs anyway)."""
    with run.policy.full_weights(everywhere=True) as module:
        return run.rollout_engine.snapshot(module)


def _evaluate(run: _Run, row: dict, step: int) -> None:
    """The evaluate hook every `cfg.eval_interval()` steps and after the last one (rank 0; eval/* columns in `row`)."""
    cfg = run.cfg
    every = cfg.eval_interval()
    if run.evaluate is None or not ((every and (step + 1) % every == 0) or step + 1 == cfg.steps):
        return
    with run.policy.full_weights() as evaluated:  # every rank: a collective under ZeRO-3
        if run.policy.dp.is_main:
            row.update({f"eval/{k}": float(v) for k, v in run.evaluate(evaluated, run.tok).items()})
            evaluated.eval()


def _stop_collapsed(run: _Run, serious: list, step: int) -> None:
    """A serious guard fired on some rank (a run-level detector, or a non-finite loss): write steps/rollouts
    and a summary tagged `collapsed` (and `non_finite_loss` for that stop) with the step and the firings, raise."""
    _write_stopped(run, serious, step, recorded=True)
    # No checkpoint of the collapsed state: a resume starts from the last good one.
    raise RecordedGuardError("; ".join(f.reason for f in serious)
                        or f"serious guard firing on rank 0 at step {step + 1}: run collapsed",
                        guard=serious[0].guard_id if serious else "", step=step + 1)


class RecordedGuardError(GuardError):
    """A stop whose summary `_stop_collapsed` wrote before raising (train_grpo writes one for any other)."""


def _write_stopped(run: _Run, serious: list, step: int, recorded: bool = False) -> None:
    """steps.parquet (possibly empty: a stop at step 1), rollouts and the summary tagged `collapsed` of a run a
    guard stopped at `step` (0-based). `recorded`: the firings are in run.guards already (else they are added)."""
    state, is_main = run.state, run.policy.dp.is_main
    write_rollouts(state, run.out_dir, is_main=is_main)
    if is_main:
        write_rows(state.step_rows, run.out_dir / STEPS_FILE)
        stopped = run_summary(state.step_rows, run.cfg, run.guards.counts, False, time.perf_counter() - run.t_start,
                           state.start_step)
        tags = ["collapsed"] + ([NON_FINITE_LOSS] if any(f.key == NON_FINITE_LOSS for f in serious) else [])
        firings = run.guards.firings + ([] if recorded else [dataclasses.asdict(f) for f in serious])
        stopped.update(tags=tags, stopped_at_step=step + 1, stopped_by=sorted({f.guard_id for f in serious}),
                       health_firings=firings, data_position=state.data_pos)
        (run.out_dir / SUMMARY_FILE).write_text(json.dumps(stopped, indent=2) + "\n")


def _finish(run: _Run) -> GRPOResult:
    """The final model (when every step is done), steps.parquet and the summary; every rank returns after
    rank 0's files exist."""
    cfg, state, out_dir, dp = run.cfg, run.state, run.out_dir, run.policy.dp
    done = bool(state.step_rows) and state.step_rows[-1]["step"] == cfg.steps
    final_dir = out_dir / FINAL_MODEL
    if done:
        with run.policy.full_weights() as trained:  # every rank: a collective under ZeRO-3
            if dp.is_main:
                save_final_model(trained, cfg, out_dir)
    summary = run_summary(state.step_rows, cfg, run.guards.counts, done, time.perf_counter() - run.t_start,
                       state.start_step)
    summary["health_firings"] = run.guards.firings
    summary["data_position"] = state.data_pos  # curriculum prompts consumed so far (> steps * P with dynamic sampling)
    if dp.is_main:
        write_rows(state.step_rows, out_dir / STEPS_FILE)
        if done:
            run.tok.save_pretrained(final_dir)
        (out_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    # No rank returns before rank 0's files exist, so a caller on any rank may read them.
    dp.barrier()
    return GRPOResult(final_dir, out_dir / STEPS_FILE, out_dir / CHECKPOINTS, summary, out_dir / ROLLOUTS_FILE)


# --------------------------------------------------------------------------------------------- CLI
def _main() -> None:
    ap = argparse.ArgumentParser(description="Reproduce docs/grpo_training.md: curriculum, GRPO, greedy eval.")
    ap.add_argument("--base", type=Path, required=True, help="base model dir (python -m rlvr_core.tiny.warmstart)")
    ap.add_argument("--out", type=Path, required=True, help="output dir (resumed if it holds a checkpoint)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--curriculum", choices=["all", "passk"], default="all",
                    help="all: every training id in data order; passk: pass rates of --passk-prompts prompts, "
                         "0 < p < 1 kept, easy_to_hard")
    ap.add_argument("--passk-prompts", type=int, default=512, help="training prompts measured for --curriculum passk")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="GRPOConfig override")
    ap.add_argument("--skip-base-eval", action="store_true")
    ap.add_argument("--engine", default="hf", help="rollout engine (rlvr_core/grpo/rollout_engine.py)")
    # The deepspeed launcher passes --local_rank=N; LOCAL_RANK in the environment says the same.
    ap.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    main = int(os.environ.get("RANK", "0")) == 0
    torch.set_num_threads(a.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    # --set memory.micro_batch_size=4: dotted keys under grpo, the pre-section names (micro_batch_size) moved.
    overrides = {f"grpo.{k}": yaml.safe_load(v) for k, v in (s.split("=", 1) for s in a.set)}
    cfg = GRPOConfig(**apply_overrides({"grpo": GRPOConfig().model_dump(mode="json")}, overrides)["grpo"])
    ds = make_synthetic_dataset(SyntheticSpec())
    kw = dict(template_id="qa", top_p=1.0, max_new_tokens=48, seed=0, batch_size=128, verifier="gsm8k",
              verifier_mode=None, verifier_workers=0, verifier_timeout_s=5.0)

    def greedy_acc(path: Path) -> float:
        m, t = load_model(path)
        rec = sample_and_verify(m, t, ds["test"], n=1, temperature=0.0, **kw)
        return sum(r["correct"] for r in rec) / len(rec)

    def evaluate(model: Any, tokenizer: Any) -> dict[str, float]:  # the held-out greedy accuracy
        rec = sample_and_verify(model, tokenizer, ds["test"], n=1, temperature=0.0, **kw)
        return {"greedy": sum(r["correct"] for r in rec) / len(rec)}

    report: dict[str, Any] = {"seed": a.seed, "overrides": overrides}
    t0 = time.perf_counter()
    if a.curriculum == "all":
        ids = [r["id"] for r in ds["train"]]
    else:  # every rank measures the same pass rates (seeded per request), so all get the same curriculum
        m, t = load_model(a.base)
        rec = sample_and_verify(m, t, ds["train"][:a.passk_prompts], n=8, temperature=1.0, **kw)
        table = filter_by_pass_rate(pass_rate_table(rec, ks=[1, 8]), low=0.0, high=1.0, drop_never=True,
                                    drop_always=True)
        ids = order_curriculum(table, "easy_to_hard", seed=0).column("problem_id").to_pylist()
    report["curriculum"] = {"kind": a.curriculum, "ids": len(ids), "wall_s": round(time.perf_counter() - t0, 1)}
    if main:
        print(json.dumps(report["curriculum"]), flush=True)
    if main and not a.skip_base_eval:
        report["base_acc"] = greedy_acc(a.base)
    t1 = time.perf_counter()
    res = train_grpo(a.base, ds["train"], ids, a.out, cfg, template_id="qa", reward=RewardConfig(verifier="gsm8k"),
                     max_new_tokens=48, seed=a.seed, progress=lambda s: print(s, flush=True), evaluate=evaluate,
                     engine=a.engine)
    report["train_wall_s"] = round(time.perf_counter() - t1, 1)
    if main:
        if res.final_model_dir.exists():
            report["trained_acc"] = greedy_acc(res.final_model_dir)
        report["summary"] = {k: v for k, v in res.summary.items() if k != "config"}
        print(json.dumps(report, indent=2))
    shutdown()


if __name__ == "__main__":
    _main()
