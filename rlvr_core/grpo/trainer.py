"""The GRPO training stage: rollouts on the live policy, verifier rewards, group advantages, DeepSpeed steps.

`train_grpo(base_model_dir, train_rows, curriculum_ids, out_dir, cfg, ...)` is the whole stage. It owns
the loop; the maths lives in the pure functions next door (advantages.py, losses.py, kl.py), which it
only calls. One step:

  1. prompts: the next P curriculum ids (cycled; from the data position, step * P unless dynamic
     sampling consumed more), rows looked up by id. An id with no row fails before any work (G-id-mismatch).
  2. rollout: HFEngine samples G completions per prompt from the *live* policy module (the very
     tensors DeepSpeed updates; under ZeRO-3 a plain copy refreshed from them first), with the
     template's stop strings and per-request seeds derived from (seed, prompt id, epoch, step, sample
     index) (G-fixed-seed). The engine returns each sampled token's RAW (temperature-1) log-prob:
     these are the old log-probs (on-policy, staleness 0). With `adaptive_sampling` a prompt gets
     further chunks of G until it has k_success correct and k_failure other completions, or a cap.
     With `max_staleness` s > 0 step t's rollouts were sampled ahead, in a thread, by a copy holding
     the weights after max(0, t - s) updates (ahead.py; the trainer publishes its weights every step);
     the old log-probs are then the behaviour policy's and the ratio leaves 1 by design.
  3. reward: VerifierPool (in-process for cheap verifiers) scores each completion against the gold;
     optionally plus DAPO's soft overlong penalty on the completion length (`overlong_buffer_len`).
     With `dynamic_sampling` (DAPO), groups whose rewards are all equal are dropped and rounds of the
     next P prompts are sampled until P groups are kept or `dynamic_sampling_max_rounds` is reached
     (the batch is then trained short: no waiting for a full one, G-partial-batch).
  4. advantages: registered estimator `cfg.advantage` over the (K, G) reward matrix of the trained
     groups (K = P unless dynamic sampling ran out of rounds).
  5. train: one teacher-forced forward over prompt + completion tokens. The prompt is tokenized
     exactly as the engine tokenized it (same tokenizer call), masks come from lengths, never token
     values (G-pad-mask). log_softmax at temperature 1, like the engine's raw log-probs. With beta > 0 a
     frozen copy of the base model gives reference log-probs. `grpo_loss`, then DeepSpeed
     backward/step (AdamW, warm-up + cosine, grad clipping and the ZeRO stage all come from the
     DeepSpeed config built from GRPOConfig, `ds_config`). `dlogp_reweight_c` > 0 multiplies each token's
     advantage by 1 + c - c * pi_old(token) (Δlog p reweighting; 0 = the plain loss, bit for bit).

Per step the row also counts verifier statuses (`status/*`, errors and timeouts visible: G-verifier-error),
and `rollout_samples_per_step` completions (text, reward, status, length) go to rollouts.parquet, written
with steps.parquet at checkpoint time (rows after the resume point are dropped on resume: no duplicates).

Guards (ids from BUGZOO; counts in the summary as `health/<id>`):
  * G-logprob-temp: at step 1 the trainer's log-probs of the sampled tokens must equal the rollout's
    (mean |diff| under a float tolerance) before any update, else GuardError naming both temperatures.
  * G-onpolicy-ratio: ratio mean/max and clip fraction every step; flagged when the first epoch's
    ratio is not ~1 (trainer and sampler disagree).
  * G-kl-explosion: KL-to-reference max above a threshold (beta > 0 only).
  * G-fixed-seed: a group whose completions are all identical text at temperature > 0 is counted.
  * G-verifier-format: steps where every group has zero reward variance (no learning signal).

Checkpoints: DeepSpeed `save_checkpoint` every `cfg.checkpoint_every` steps and at the end, with the
step, the data position and the metric rows so far in the client state. If `out_dir/checkpoints`
already holds one, the run resumes there: model, optimizer, lr schedule, step and data position are
restored, and since every sampling seed is a function of (seed, prompt id, epoch, step, sample index),
the resumed run sees the same prompts and draws.

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

import copy
import dataclasses
import json
import math
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from rlvr_core.config import GRPOConfig
from rlvr_core.export import LORA_CONFIG  # written beside the checkpoints: what export needs to merge adapters
from rlvr_core.grpo.ahead import AheadSampler, snapshot
from rlvr_core.grpo.advantages import get_advantage, overlong_penalty, weight_negative_advantages
from rlvr_core.grpo.distributed import (DataParallel, check_divisible, global_normalisers, launch_world_size,
                                        reduce_loss_metrics, shutdown)
from rlvr_core.grpo.guards import GUARD_IDS, HealthConfig, HealthMonitor, firing_dict
from rlvr_core.grpo.losses import grpo_loss, mask_from_lengths
from rlvr_core.grpo.sampling_strategies import AdaptiveSamplingState, filter_zero_variance_groups

__all__ = ["GRPOResult", "GuardError", "train_grpo", "ds_config", "build_batch", "sequence_logprobs",
           "gold_of", "rows_for_curriculum"]

CHECKPOINTS = "checkpoints"
FINAL_MODEL = "final_model"
LORA_ADAPTER = "lora_adapter"  # with lora_rank > 0: the trained adapters alone, in peft's format
STEPS_FILE = "steps.parquet"
SUMMARY_FILE = "grpo_summary.json"
ROLLOUTS_FILE = "rollouts.parquet"
AHEAD_WEIGHTS = "ahead_weights.pt"  # in a checkpoint's tag folder with max_staleness > 0: the versions before it
STATUSES = ("correct", "incorrect", "no_answer", "error", "timeout")  # verifiers.base.Status values


class GuardError(RuntimeError):
    """A guard that stops the run (as opposed to guards that only count and flag)."""


@dataclass
class GRPOResult:
    final_model_dir: Path      # save_pretrained of the trained policy + tokenizer (from_pretrained-loadable)
    steps_path: Path           # Parquet, one row per step (metrics listed in docs/grpo_training.md)
    checkpoints_dir: Path      # DeepSpeed checkpoints (tag step<N>, `latest` file)
    summary: dict[str, Any] = field(default_factory=dict)
    rollouts_path: Path | None = None  # Parquet, rollout_samples_per_step completions per step (docs)


# ------------------------------------------------------------------------------------------- environment
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ensure_launch_env() -> list[str]:
    """What a launcher (torchrun, deepspeed) would have exported, for a single process started without one:
    DeepSpeed needs all five variables or it falls back to MPI discovery (STACK.md). A launcher's values
    are never overwritten. Returns the launcher variables it added (see `train_grpo`)."""
    from rlvr_core.settings import paths

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    # The ~35 s op compile is paid once per cache; point it at the project's cache, not ~/.cache.
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(paths().torch_extensions))
    added = []
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                 ("MASTER_PORT", None)):
        if k not in os.environ:
            os.environ[k] = v if v is not None else str(_free_port())
            added.append(k)
    return added


# ---------------------------------------------------------------------------------------- DeepSpeed config
def ds_config(cfg: GRPOConfig, batch_size: int, world_size: int = 1) -> dict[str, Any]:
    """The DeepSpeed config for rollout batches of `batch_size` sequences over all ranks (no gradient
    accumulation; each rank holds batch_size / world_size), each trained for epochs_per_step updates.

    The scheduler is WarmupCosineLR with a linear warm-up: lr climbs from lr/(warmup+1) to lr over
    `warmup_steps`, then decays (cosine) to cos_min_ratio * lr at `steps`. DeepSpeed's scheduler starts
    at iteration -1 (lr 0), so the trainer advances it once before the first step (see `_engine`);
    otherwise step 1 would be a wasted update with lr 0.
    """
    # DeepSpeed steps the scheduler once per optimizer update, and a rollout step makes epochs_per_step
    # of them: the schedule is laid out in updates, so warm-up and decay span the run's steps whatever
    # the epoch count (in steps it would end after steps / epochs_per_step).
    E = cfg.epochs_per_step
    warm = max(1, cfg.warmup_steps * E)
    conf: dict[str, Any] = {
        "train_batch_size": batch_size,
        "train_micro_batch_size_per_gpu": batch_size // world_size,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": cfg.lr, "eps": cfg.adam_eps, "betas": [0.9, 0.999],
                                                   "weight_decay": cfg.weight_decay, "torch_adam": True}},
        "scheduler": {"type": "WarmupCosineLR", "params": {
            "total_num_steps": max(cfg.steps * E, warm + 1), "warmup_num_steps": warm,
            "warmup_min_ratio": 1.0 / (warm + 1) if cfg.warmup_steps else 1.0,
            "cos_min_ratio": cfg.cos_min_ratio, "warmup_type": "linear"}},
        "gradient_clipping": cfg.grad_clip,
        "zero_optimization": {"stage": cfg.zero_stage},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if cfg.precision == "bf16":
        conf["bf16"] = {"enabled": True}
    elif cfg.precision == "fp16":
        conf["fp16"] = {"enabled": True, "initial_scale_power": 12}
    return conf


def with_lora(model, cfg: GRPOConfig, seed: int):
    """`model` wrapped with peft LoRA adapters (B = 0 at the start, so the wrapped model computes exactly
    what the base does); only the adapters train. Returns the PeftModel.

    A is initialised at random from a generator seeded with `seed`: two runs with the same seed start
    from the same adapters (peft would draw them from the global torch RNG, whatever state it is in)."""
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=0.0, bias="none",
                      target_modules=cfg.lora_target_modules or "all-linear", task_type="CAUSAL_LM")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(model, lora)


def _engine(model, cfg: GRPOConfig, batch_size: int, world_size: int):
    import deepspeed

    if world_size == 1 and os.environ.get("DS_ACCELERATOR") == "cpu":
        # DeepSpeed's CPU backend JIT-compiles its shared-memory all-reduce op (~35 s on a fresh machine)
        # in every initialize. One process has nothing to reduce, so mark the op unavailable and it keeps
        # plain gloo (deepspeed.ops documents that edits to __compatible_ops__ persist). Several processes
        # still build and use it.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    engine, _, _, scheduler = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters()
                                                                                   if p.requires_grad],
                                                   config=ds_config(cfg, batch_size, world_size))
    scheduler.step()  # iteration -1 (lr 0) -> 0, so the first update uses the first warm-up lr
    return engine, scheduler


# ----------------------------------------------------------------------------------------------- batching
def gold_of(row: dict) -> Any:
    """The verifier's gold: `final_answer` when the row has one (as stages.sample_and_verify does)."""
    return row["final_answer"] if "final_answer" in row else row["answer"]


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


def build_batch(prompt_tokens: list[list[int]], completion_tokens: list[list[int]], pad_id: int):
    """Right-padded prompt+completion batch for a teacher-forced forward.

    Returns input_ids (B, S), attention_mask (B, S) and position_ids (B, S), all from lengths; `gather`
    (B, T) = index of the logit that predicts completion token t (prompt_len - 1 + t, clamped on
    padding); `targets` (B, T) the completion tokens (pad on padding); `lengths` (B,) completion lengths.
    The pad value fills only masked slots, so it can be any id, including one a completion contains.
    """
    B = len(prompt_tokens)
    plen = [len(p) for p in prompt_tokens]
    clen = [len(c) for c in completion_tokens]
    S = max(p + c for p, c in zip(plen, clen))
    T = max(max(clen), 1)
    input_ids = torch.full((B, S), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((B, S), dtype=torch.long)
    targets = torch.full((B, T), pad_id, dtype=torch.long)
    for b, (p, c) in enumerate(zip(prompt_tokens, completion_tokens)):
        input_ids[b, :len(p) + len(c)] = torch.tensor(list(p) + list(c), dtype=torch.long)
        attention_mask[b, :len(p) + len(c)] = 1
        if c:
            targets[b, :len(c)] = torch.tensor(c, dtype=torch.long)
    lengths = torch.tensor(clen, dtype=torch.long)
    gather = (torch.tensor(plen)[:, None] - 1 + torch.arange(T)[None, :]).clamp(max=S - 1)
    position_ids = torch.arange(S)[None, :].expand(B, S).contiguous()
    return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
            "gather": gather, "targets": targets, "lengths": lengths}


def sequence_logprobs(model, batch: dict, *, temperature: float = 1.0,
                      with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(completion token t | prefix) for every (b, t), (B, T) float32, padding holds garbage.

    `temperature` must be 1 for on-policy RL with an engine that returns raw log-probs; it is a
    parameter only so tests can plant the G-logprob-temp bug. Entropy (B, T) of the full next-token
    distribution is returned when asked (detached, it is a metric).
    """
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                position_ids=batch["position_ids"], use_cache=False)
    logits = out.logits.float()
    idx = batch["gather"][:, :, None].expand(-1, -1, logits.shape[-1])
    step_logits = logits.gather(1, idx)                              # (B, T, V)
    if temperature != 1.0:
        step_logits = step_logits / temperature
    logp_all = torch.log_softmax(step_logits, dim=-1)
    logp = logp_all.gather(-1, batch["targets"][:, :, None])[:, :, 0]
    ent = None
    if with_entropy:
        with torch.no_grad():
            ent = -(logp_all.exp() * logp_all).sum(-1)
    return logp, ent


def _pad_2d(values: list[list[float]], T: int) -> torch.Tensor:
    out = torch.zeros((len(values), T), dtype=torch.float32)
    for b, v in enumerate(values):
        if v:
            out[b, :len(v)] = torch.tensor(v, dtype=torch.float32)
    return out


def _masked_mean(x: torch.Tensor, m: torch.Tensor) -> float:
    n = int(m.sum())
    return float(torch.where(m, x, torch.zeros_like(x)).sum() / n) if n else float("nan")


# ------------------------------------------------------------------------------------------- the stage
def train_grpo(base_model_dir: str | Path, train_rows: list[dict], curriculum_ids: list[str], out_dir: Path,
               cfg: GRPOConfig, *, template_id: str, verifier: str, verifier_mode: str | None,
               max_new_tokens: int, seed: int, progress: Callable[[str], None] | None = None,
               stop_after_steps: int | None = None,
               evaluate: Callable[[Any, Any], dict[str, float]] | None = None) -> GRPOResult:
    """Train the policy in `base_model_dir` with GRPO on the curriculum; see the module docstring.

    Resumes from `out_dir/checkpoints` when it holds a checkpoint. `stop_after_steps` ends this call
    after that many steps (counted from the resume point) with a checkpoint, as if the job were
    killed; a second call resumes. `evaluate(model, tokenizer) -> {name: value}` is called every
    `cfg.eval_every` steps and after the last one (G-no-eval); its values land in that step's row as
    `eval/<name>`. Returns a GRPOResult; `final_model_dir` exists only when all `cfg.steps` steps are done.

    Under a launcher every rank calls this with the same arguments; P must be divisible by the world
    size. Rank 0 alone calls `progress` and `evaluate` and writes steps/summary/final model; every rank
    returns once they exist (the summary is rank 0's; other ranks' rows lack the eval values).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlvr_core.sampling import HFEngine, SamplingParams
    from rlvr_core.sampling.base import unique_fraction
    from rlvr_core.templates import get_template
    from rlvr_core.verifiers.pool import VerifierPool

    t_start = time.perf_counter()
    out_dir = Path(out_dir)
    ckpt_dir = out_dir / CHECKPOINTS
    rows = rows_for_curriculum(train_rows, list(curriculum_ids))
    P, G = cfg.prompts_per_step, cfg.group_size
    if P > len(rows):
        # The engine refuses repeated prompt ids in one call (they would share seeds).
        raise ValueError(f"prompts_per_step={P} exceeds the curriculum's {len(rows)} prompts")
    if cfg.overlong_buffer_len > max_new_tokens:
        raise ValueError(f"overlong_buffer_len={cfg.overlong_buffer_len} exceeds max_new_tokens={max_new_tokens}: "
                         "the penalty window must lie inside the generation cap")
    added_env = _ensure_launch_env()
    world = launch_world_size()
    check_divisible(P, world)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    template = get_template(template_id)
    guard_tol = cfg.logprob_guard_tol or (1e-3 if cfg.precision == "fp32" else 5e-2)

    tok = AutoTokenizer.from_pretrained(base_model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(base_model_dir, local_files_only=True, dtype=torch.float32)
    ref_model = None
    if cfg.lora_rank:
        model = with_lora(model, cfg, seed)
    elif cfg.beta > 0:
        # Copied before DeepSpeed wraps the policy, so ZeRO-3 never partitions it: every rank holds it whole.
        # (With LoRA the reference is the policy with its adapters switched off, in the step below.)
        ref_model = copy.deepcopy(model).eval().requires_grad_(False)
    # ZeRO-3 partitions the policy and its forward hooks run collectives, so no rank may run it alone
    # (rank 0 evaluating) or a data-dependent number of times (decoding until every row stops). Sampling,
    # evaluation and export then use a plain copy that receives the policy's weights before each use, as
    # a separate inference engine would.
    replica = copy.deepcopy(model).eval().requires_grad_(False) if cfg.zero_stage == 3 else None
    # With max_staleness > 0 the rollouts are sampled ahead, in a thread, by a copy that receives each
    # policy version when the trainer publishes it (ahead.py).
    ahead_model = copy.deepcopy(model).eval().requires_grad_(False) if cfg.max_staleness else None
    engine, scheduler = _engine(model, cfg, P * G, world)
    # The process group exists now. A MASTER_PORT we invented would otherwise be inherited by every process
    # this one starts later (a demo's next subprocess, a test's server), which would then try to listen on
    # the port this process's group already holds. (RANK, LOCAL_RANK, WORLD_SIZE stay: ZeRO-3 reads
    # LOCAL_RANK during the forward pass, and their single-process values are harmless to inherit.)
    if "MASTER_PORT" in added_env:
        os.environ.pop("MASTER_PORT", None)
    policy = engine.module
    dev = engine.device
    if cfg.lora_rank and DataParallel.current(dev).is_main:
        lc = policy.peft_config["default"]
        (ckpt_dir / LORA_CONFIG).write_text(json.dumps({
            "r": lc.r, "lora_alpha": lc.lora_alpha, "use_rslora": bool(getattr(lc, "use_rslora", False)),
            "target_modules": sorted(lc.target_modules) if isinstance(lc.target_modules, (set, list)) else lc.target_modules,
        }, indent=2) + "\n")
    dp = DataParallel.current(dev)
    # No dropout anywhere: the rollout and the teacher-forced pass must see the same function.
    policy.eval()
    if ref_model is not None:
        ref_model = ref_model.to(dev, torch.bfloat16 if cfg.precision == "bf16" else torch.float32)
    if replica is not None:
        replica = replica.to(dev, next(policy.parameters()).dtype)  # sample in the precision that trains
    if ahead_model is not None:
        ahead_model = ahead_model.to(dev, next(policy.parameters()).dtype)
    # Ranks > 0 compute the same step rows as rank 0 but never report or write them.
    say = (progress or (lambda _msg: None)) if dp.is_main else (lambda _msg: None)

    def current_weights():
        """The module holding the policy's current weights; collective under ZeRO-3 (every rank calls it)."""
        if replica is None:
            return policy
        _copy_partitioned(policy, replica)
        return replica

    # ---- resume ---------------------------------------------------------------------------------
    # data_pos: curriculum position of the next step's first prompt. Without dynamic sampling it is step * P;
    # with it, it advances by every prompt a step sampled, so it is checkpointed with the step.
    start_step, step_rows, data_pos, ahead_weights = 0, [], 0, {}
    if (ckpt_dir / "latest").is_file():
        path, client = engine.load_checkpoint(str(ckpt_dir))
        if path is None:
            raise RuntimeError(f"{ckpt_dir} has a 'latest' file but DeepSpeed could not load it")
        start_step, step_rows = int(client["step"]), list(client["step_rows"])
        data_pos = int(client.get("data_pos", start_step * P))  # checkpoints from before dynamic sampling
        if cfg.max_staleness and start_step:
            saved = ckpt_dir / f"step{start_step}" / AHEAD_WEIGHTS
            if not saved.is_file():
                raise RuntimeError(f"resuming with max_staleness={cfg.max_staleness} needs {saved} (the policy "
                                   "versions the next steps sample with); the checkpoint was saved without it")
            ahead_weights = torch.load(saved, map_location=dev, weights_only=True)
        say(f"resumed from {path} at step {start_step}")
    # Rollout samples of the steps up to the resume point; rows of later steps (written by a call killed
    # before its checkpoint) are dropped here and sampled again, so nothing is duplicated.
    rollout_rows = _read_rollouts(out_dir / ROLLOUTS_FILE, start_step) if dp.is_main else []
    last_step = cfg.steps if stop_after_steps is None else min(cfg.steps, start_step + stop_after_steps)

    sampling_model = ahead_model if ahead_model is not None else replica if replica is not None else policy
    sampler = HFEngine(sampling_model, tok, batch_size=cfg.rollout_batch_size, device=dev)
    params = SamplingParams(n=G, temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=max_new_tokens,
                            stop=template.stop, seed=seed)
    norm_len = max_new_tokens if cfg.loss_agg == "seq-mean-token-sum-norm" else None
    options = {"mode": verifier_mode} if verifier_mode else {}
    pool = VerifierPool(verifier, options, workers=0)
    guards = {g: 0 for g in ("G-onpolicy-ratio", "G-kl-explosion", "G-fixed-seed", "G-verifier-format", *GUARD_IDS)}
    for r in step_rows:
        for g in guards:
            guards[g] += int(r.get(f"health/{g}", 0))
    # Run-level detectors over the step history (collapse, entropy floor, reward hacking; guards.py).
    # A resumed run replays its history first: those firings are already in its rows.
    health = HealthMonitor(HealthConfig())
    health.update(step_rows)
    health_firings: list[dict] = []

    def write_rollouts() -> None:
        if dp.is_main and (rollout_rows or (out_dir / ROLLOUTS_FILE).exists()):
            _write_rows(rollout_rows, out_dir / ROLLOUTS_FILE)

    def save(step: int) -> None:
        # Rollouts first: if the job dies before the checkpoint below, the resume drops their extra rows
        # (steps after the checkpoint it resumes from); written after it, they could be lost instead.
        write_rollouts()
        if ahead is not None and dp.is_main:  # before DeepSpeed's files and its `latest`: a resume finds both
            (ckpt_dir / f"step{step}").mkdir(parents=True, exist_ok=True)
            torch.save(ahead.for_checkpoint(step), ckpt_dir / f"step{step}" / AHEAD_WEIGHTS)
        # Collective: under ZeRO every rank writes its own partition of the model/optimizer state.
        engine.save_checkpoint(str(ckpt_dir), tag=f"step{step}",
                               client_state={"step": step, "step_rows": step_rows, "data_pos": data_pos})
        if dp.is_main:
            _write_rows(step_rows, out_dir / STEPS_FILE)

    L = len(rows)
    overlong = cfg.overlong_buffer_len > 0
    max_rounds = cfg.dynamic_sampling_max_rounds if cfg.dynamic_sampling else 1
    M = cfg.adaptive_max_samples if cfg.adaptive_sampling else G  # the most completions one group can have
    shard = list(range(P))[dp.shard(P)]  # this rank's prompt slots in every round

    def generate(positions: list[int], prompts: list[str], ids: list[str], step: int, epoch: int,
                 chunk: SamplingParams = params, first: int = 0):
        if not cfg.dynamic_sampling:
            return sampler.generate(prompts, ids, chunk, step=step, epoch=epoch, first_sample_index=first)
        # Dynamic sampling may sample one prompt twice in a step (rounds run past the curriculum's end):
        # each prompt's seed gets the epoch of its own position, so (prompt id, epoch) names the position
        # and no two requests of a step share a seed. One engine call per epoch segment.
        out: list = []
        i = 0
        while i < len(positions):
            j = i
            while j < len(positions) and positions[j] // L == positions[i] // L:
                j += 1
            out += sampler.generate(prompts[i:j], ids[i:j], chunk, step=step, epoch=positions[i] // L,
                                    first_sample_index=first)
            i = j
        return out

    def rollout(positions: list[int], my_rows: list[dict], prompts: list[str], step: int, epoch: int):
        """Sample and verify this rank's prompts: (groups, their verifier outcomes, seconds generating).

        With max_staleness > 0 the groups were sampled ahead (see `sample_ahead`); the seconds are the
        trainer's wait for them.

        Without adaptive sampling every group has G completions. With it, all prompts get a first chunk
        of G; those that lack adaptive_k_success correct or adaptive_k_failure incorrect completions get
        further chunks (sample indices continuing where the last chunk ended, so the seeds are those of
        one larger call) until they have them or reach adaptive_max_samples. The chunk loop is this
        rank's own: no collective runs inside it, so ranks may loop different numbers of times."""
        ids = [r["id"] for r in my_rows]
        golds = [gold_of(r) for r in my_rows]
        if ahead is not None:
            batch, waited = ahead.take(step)
            if [g[0].prompt_id for g in batch.groups] != ids:  # golds below are looked up by these rows
                raise RuntimeError(f"step {step + 1}: the ahead sampler sampled other prompts than the trainer's")
            taken.update(version=batch.version, generate_s=batch.generate_s)
            flat = pool.verify_many([(x.text, gold) for gold, g in zip(golds, batch.groups) for x in g])
            return batch.groups, [flat[k * G:(k + 1) * G] for k in range(len(golds))], waited
        groups: list[list] = [[] for _ in my_rows]
        outs: list[list] = [[] for _ in my_rows]
        states = [AdaptiveSamplingState(cfg.adaptive_k_success, cfg.adaptive_k_failure, M, G) for _ in my_rows]
        t_gen = 0.0
        while True:
            # Pending prompts all hold the same number of samples (equal chunks so far), so one call serves them.
            todo = [k for k, st in enumerate(states) if st.n == 0 or (cfg.adaptive_sampling and not st.done)]
            if not todo:
                return groups, outs, t_gen
            first = states[todo[0]].n
            n = G if first == 0 else states[todo[0]].next_chunk()
            tg = time.perf_counter()
            new = generate([positions[k] for k in todo], [prompts[k] for k in todo], [ids[k] for k in todo],
                           step, epoch, params if n == G else dataclasses.replace(params, n=n), first)
            t_gen += time.perf_counter() - tg
            verified = pool.verify_many([(x.text, golds[k]) for k, g in zip(todo, new) for x in g])
            for i, (k, g) in enumerate(zip(todo, new)):
                got = verified[i * n:(i + 1) * n]
                groups[k] += g
                outs[k] += got
                states[k] = states[k].observe(o.status.value == "correct" for o in got)

    def sample_ahead(step: int) -> list:
        """Step `step`'s groups, in the ahead sampler's thread (no dynamic sampling: step t starts at t * P
        from where this call started). Same prompts, seeds and engine call as the on-policy path."""
        pos = first_pos + (step - start_step) * P
        my_rows = [rows[(pos + i) % L] for i in shard]
        return sampler.generate([template.render(r["question"]) for r in my_rows], [r["id"] for r in my_rows],
                                params, step=step, epoch=pos // L)

    ahead, taken, first_pos = None, {}, data_pos
    if cfg.max_staleness and start_step < last_step:
        ahead = AheadSampler(ahead_model, sample_ahead, first_step=start_step, last_step=last_step,
                             max_staleness=cfg.max_staleness)
        for v in sorted(ahead_weights):  # a resume: the versions before it, then its own
            ahead.publish(int(v), ahead_weights[v])
        ahead.publish(start_step, snapshot(current_weights()))
        ahead.start()
        put_wait = 0.0

    try:
        for step in range(start_step, last_step):
            t0 = time.perf_counter()
            epoch = data_pos // L
            if ahead is None:
                current_weights()  # ZeRO-3: refresh the sampling copy before it samples
            # Rollout rounds. Round k samples the P prompts at positions data_pos + k*P ...; each rank its
            # contiguous share. Without dynamic sampling there is exactly one round and every group is kept.
            # Every decision below comes from the gathered (all ranks) per-group numbers, so every rank
            # agrees on the rounds and on the kept groups.
            local: dict[int, tuple] = {}  # step-wide group index -> (row, prompt, samples, outcomes), this rank's
            infos: list[torch.Tensor] = []
            selected: list[int] = []      # step-wide indices of the groups trained, in sampling order
            rounds = dropped = 0
            t_roll = time.perf_counter() - t0  # the ZeRO-3 weight copy counts as rollout time
            while rounds < max_rounds and len(selected) < P:
                positions = [data_pos + rounds * P + i for i in shard]
                my_rows = [rows[q % L] for q in positions]
                prompts = [template.render(r["question"]) for r in my_rows]
                groups, group_outs, t_gen = rollout(positions, my_rows, prompts, step, epoch)
                policy.eval()  # HFEngine calls .eval() too; keep it explicit
                t_roll += t_gen
                # Per group: M verifier rewards, M overlong penalties (both NaN past the group's size: groups
                # differ in size only under adaptive sampling, M = G otherwise), unique fraction, generated
                # tokens, truncations, verifier status counts. One gather gives every rank the round's (P, 2M + 8).
                info = []
                for k, (r, g, outs) in enumerate(zip(my_rows, groups, group_outs)):
                    local[rounds * P + shard[k]] = (r, prompts[k], g, outs)
                    pen = (overlong_penalty(torch.tensor([len(x.token_ids) for x in g]), max_new_tokens,
                                            cfg.overlong_buffer_len, cfg.overlong_penalty_factor).tolist()
                           if overlong else [0.0] * len(g))
                    pad = [math.nan] * (M - len(g))
                    info.append([float(o.reward) for o in outs] + pad + pen + pad
                                + [unique_fraction(g), sum(len(x.token_ids) for x in g),
                                   sum(x.finish_reason == "length" for x in g)]
                                + [sum(o.status.value == st for o in outs) for st in STATUSES])
                info = dp.gather(torch.tensor(info, dtype=torch.float64))
                infos.append(info)
                keep = [True] * P
                if cfg.dynamic_sampling:  # DAPO: a group whose rewards are all equal has advantage 0 everywhere
                    shaped = info[:, :M].float() + info[:, M:2 * M].float() if overlong else info[:, :M].float()
                    keep = filter_zero_variance_groups(shaped).keep_groups.tolist()
                    dropped += keep.count(False)
                selected += [rounds * P + i for i in range(P) if keep[i]][:P - len(selected)]
                rounds += 1
            info_all = torch.cat(infos)
            rewards = info_all[:, :M].float()  # verifier rewards of every group sampled this step (NaN-padded)
            penalties = info_all[:, M:2 * M].float()
            valid = torch.isfinite(rewards)   # (groups, M): which slots hold a completion
            sizes = valid.sum(1)              # completions per group: G, or more under adaptive sampling
            # The advantage sees the trained groups' rewards, as in one process; each rank keeps its rows.
            # K = P, unless dynamic sampling ran out of rounds (a partial batch, trained as it is).
            K = len(selected)
            shaped_sel = (rewards + penalties if overlong else rewards)[selected]
            adv_all = _group_advantages(cfg.advantage, shaped_sel, valid[selected]) if K else torch.zeros((0, M))
            adv_all = weight_negative_advantages(adv_all, cfg.negative_advantage_weight)
            mine = [(j, local[g]) for j, g in enumerate(selected) if g in local]
            samples = [x for _, (_, _, g, _) in mine for x in g]
            adv = (torch.cat([adv_all[j, :len(g)] for j, (_, _, g, _) in mine]) if mine else torch.zeros(0)).to(dev)
            t2 = time.perf_counter()

            if samples:
                # Prompt tokens exactly as the engine encoded them (same tokenizer call and flag).
                enc = [tok(prompt, add_special_tokens=sampler.add_special_tokens)["input_ids"]
                       for _, (_, prompt, _, _) in mine]
                batch = build_batch([e for e, (_, (_, _, g, _)) in zip(enc, mine) for _ in g],
                                    [x.token_ids for x in samples], sampler.pad_token_id)
                old_rows = [x.logprobs for x in samples]
            else:
                # This rank trains no group (dynamic sampling kept fewer than the world size, or none): one
                # empty completion, mask all False, so the loss is 0 and every gradient exactly 0, but the
                # forward and backward (and their collectives) run as on every other rank.
                batch = build_batch([[sampler.pad_token_id]], [[]], sampler.pad_token_id)
                adv, old_rows = torch.zeros(1, device=dev), [[]]
            batch = {k: v.to(dev) for k, v in batch.items()}
            T = batch["targets"].shape[1]
            mask = mask_from_lengths(batch["lengths"], T)
            old_logp = _pad_2d(old_rows, T).to(dev)
            ref_logp = None
            if ref_model is not None:
                with torch.no_grad():
                    ref_logp, _ = sequence_logprobs(ref_model, batch)
            elif cfg.lora_rank and cfg.beta > 0:
                with torch.no_grad(), policy.disable_adapter():  # the base model, exactly
                    ref_logp, _ = sequence_logprobs(policy, batch)

            n_local = int(mask.sum())
            # The whole step's token and sequence counts: the ranks' losses then add up to the 1-process loss.
            norm = global_normalisers(dp, n_local, max(int(sizes[selected].sum()), 1))
            n_tok = norm["n_tokens"]
            for ep in range(cfg.epochs_per_step):
                logp, ent = sequence_logprobs(engine, batch, temperature=cfg.logprob_temperature,
                                              with_entropy=(ep == 0))
                loss, m = grpo_loss(logp, old_logp, adv, mask, ref_logp=ref_logp, beta=cfg.beta,
                                    kl_estimator=cfg.kl_estimator, clip_low=cfg.clip_low, clip_high=cfg.clip_high,
                                    agg_mode=cfg.loss_agg, norm_len=norm_len, lowprob_c=cfg.dlogp_reweight_c,
                                    num_tokens=norm["num_tokens"], num_seqs=norm["num_seqs"])
                if ep == 0:
                    first = reduce_loss_metrics(dp, {
                        **{k: float(v) for k, v in m.items()},
                        "logprob_abs_diff": _masked_mean((logp.detach() - old_logp).abs(), mask),
                        "entropy": _masked_mean(ent, mask)}, n_local, n_tok)
                    diff = first["logprob_abs_diff"]
                    if step == 0 and n_tok and not diff <= guard_tol:  # (no token trained: nothing to compare)
                        raise GuardError(
                            f"G-logprob-temp: trainer log-probs differ from the rollout's by {diff:.4g} (mean abs, "
                            f"tolerance {guard_tol:g}) on the same sampled tokens at step 1. The rollout engine "
                            f"returns raw log-probs (temperature 1; sampling temperature {cfg.temperature:g}); "
                            f"the trainer computed them at temperature {cfg.logprob_temperature:g}.")
                lr = float(engine.optimizer.param_groups[0]["lr"])
                # `loss` is this rank's share of the global loss; DeepSpeed divides the summed gradients by
                # the world size, so scale it back up to get the single-process gradient.
                engine.backward(loss * dp.world)
                grad_norm = _grad_norm(engine, cfg.zero_stage)  # stage 0: from .grad before the step
                engine.step()
                if grad_norm is None:
                    gn = engine.get_global_grad_norm()
                    grad_norm = float(gn) if gn is not None else float("nan")
            loss_last = dp.sum([float(m["loss"])])[0]
            t_sync = 0.0
            if ahead is not None:
                # The weight sync: the version this step made, for the step that samples with it (collective
                # under ZeRO-3: every rank gathers, like the on-policy refresh it replaces). Part of train time.
                ts = time.perf_counter()
                ahead.publish(step + 1, snapshot(current_weights()))
                t_sync = time.perf_counter() - ts
            t3 = time.perf_counter()

            # Per-group numbers of every group sampled this step (all rounds), in sampling order: every rank
            # derives the same row.
            n_groups = rounds * P
            n_drawn = int(sizes.sum())  # completions sampled this step, all rounds
            uniq = info_all[:, 2 * M].tolist()
            gen_tokens, n_trunc = int(info_all[:, 2 * M + 1].sum()), int(info_all[:, 2 * M + 2].sum())
            status = [int(v) for v in info_all[:, 2 * M + 3:].sum(0).tolist()]
            zero_var = float((~filter_zero_variance_groups(rewards).keep_groups).float().mean())
            staleness = step - taken["version"] if ahead is not None else 0
            flags = {
                # Only rollouts of the very weights being trained must give ratio 1: stale ones differ by design.
                "G-onpolicy-ratio": int(staleness == 0 and (abs(first["ratio_mean"] - 1) > cfg.ratio_guard_tol
                                                            or first["clip_frac"] > cfg.ratio_guard_tol)),
                "G-kl-explosion": int(ref_logp is not None and first.get("kl_ref_max", 0.0) > cfg.kl_spike_max),
                "G-fixed-seed": int(cfg.temperature > 0
                                    and sum(round(u * n) == 1 for u, n in zip(uniq, sizes.tolist())) > n_groups // 2),
                "G-verifier-format": int(zero_var == 1.0),
            }
            # A sample of the trained completions for rollouts.parquet, round-robin over the trained groups
            # (sample 0 of each, then sample 1 of each that has one, ...). Each rank contributes the ones it
            # holds; rank 0 keeps them in k order, so N ranks log exactly what one process logs.
            picks = []
            sel_sizes = sizes[selected].tolist()
            order = [(j, i) for i in range(M) for j in range(K) if i < sel_sizes[j]]
            for k, (j, i) in enumerate(order[:cfg.rollout_samples_per_step]):
                if selected[j] in local:
                    r, prompt, g, outs = local[selected[j]]
                    picks.append((k, {
                        "step": step + 1, "position": data_pos + selected[j], "prompt_id": r["id"],
                        "sample_index": g[i].sample_index, "prompt": prompt, "completion": g[i].text,
                        "reward": float(outs[i].reward), "status": outs[i].status.value,
                        "length": len(g[i].token_ids), "finish_reason": g[i].finish_reason,
                        "overlong_penalty": float(penalties[selected[j], i]), "advantage": float(adv_all[j, i])}))
            if K and cfg.rollout_samples_per_step:
                picked = dp.gather_objects(picks)
                if dp.is_main:
                    rollout_rows.extend(row for _, row in sorted(picked, key=lambda kv: kv[0]))
            for g, v in flags.items():
                guards[g] += v
            row = {
                "step": step + 1, "epoch": epoch, "lr": lr, "loss": first["loss"], "pg_loss": first["pg_loss"],
                "loss_last_epoch": loss_last,
                "ratio_mean": first["ratio_mean"], "ratio_max": first["ratio_max"], "ratio_min": first["ratio_min"],
                "clip_frac": first["clip_frac"], "clip_frac_low": first["clip_frac_low"],
                "clip_frac_high": first["clip_frac_high"], "approx_kl_old_new": first["approx_kl_old_new"],
                "logprob_abs_diff": diff,
                "kl_ref_mean": first.get("kl_ref_mean", float("nan")),
                "kl_ref_max": first.get("kl_ref_max", float("nan")),
                "entropy": first["entropy"], "reward_mean": float(rewards[valid].mean()),
                "reward_std": float(rewards[valid].std()),
                "zero_var_group_share": zero_var,
                "completion_len_mean": gen_tokens / n_drawn,
                "truncation_share": n_trunc / n_drawn,
                "samples_per_prompt_mean": n_drawn / n_groups, "samples_per_prompt_max": int(sizes.max()),
                "unique_frac_mean": sum(uniq) / len(uniq),
                "grad_norm": grad_norm, "n_tokens": n_tok,
                "t_rollout_s": t_roll, "t_reward_s": t2 - t0 - t_roll, "t_train_s": t3 - t2,
                "tokens_per_s": gen_tokens / max(t3 - t0, 1e-9),
                **{f"status/{st}": n for st, n in zip(STATUSES, status)},
                "overlong/penalty_mean": float(penalties[valid].mean()),
                "overlong/penalized_share": float((penalties[valid] < 0).float().mean()),
                "dynamic/rounds": rounds, "dynamic/prompts_consumed": n_groups,
                "dynamic/groups_dropped": dropped, "dynamic/groups_kept": K,
                **{f"health/{g}": v for g, v in flags.items()},
            }
            if ahead is not None:
                buf = ahead.buffer.stats()
                row.update({"staleness": staleness, "t_generate_s": taken["generate_s"], "t_sync_s": t_sync,
                            "buffer/size": buf["size"], "buffer/evicted": buf["evicted"],
                            "buffer/put_wait_s": buf["put_wait_s"] - put_wait})
                put_wait = buf["put_wait_s"]
            if cfg.adaptive_sampling:  # share of groups that got their k_success and k_failure before the cap
                correct = info_all[:, 2 * M + 3]
                row["adaptive/enough_share"] = float(((correct >= cfg.adaptive_k_success)
                                                      & (sizes - correct >= cfg.adaptive_k_failure)).float().mean())
            if evaluate is not None and ((cfg.eval_every and (step + 1) % cfg.eval_every == 0)
                                         or step + 1 == cfg.steps):
                evaluated = current_weights()  # every rank: a collective under ZeRO-3
                if dp.is_main:
                    row.update({f"eval/{k}": float(v) for k, v in evaluate(evaluated, tok).items()})
                evaluated.eval()
            step_rows.append(row)
            for g in GUARD_IDS:
                row.setdefault(f"health/{g}", 0)
            new = health.update(step_rows)  # firings at this step only, once per episode
            for f in new:
                say(("STOP " if f.serious else "flag ") + f.reason)
                if not row[f"health/{f.guard_id}"]:  # G-kl-explosion may be set by the per-step flag already
                    row[f"health/{f.guard_id}"] = 1
                    guards[f.guard_id] += 1
                health_firings.append(firing_dict(f))
            serious = [f for f in new if f.serious]
            # One decision for every rank: eval/* columns exist on rank 0 only, and no rank may stop alone.
            if dp.max([float(bool(serious))])[0] > 0:
                write_rollouts()
                if dp.is_main:
                    _write_rows(step_rows, out_dir / STEPS_FILE)
                    stopped = _summary(step_rows, cfg, guards, False, time.perf_counter() - t_start, start_step)
                    stopped.update(tags=["collapsed"], stopped_at_step=step + 1, health_firings=health_firings)
                    (out_dir / SUMMARY_FILE).write_text(json.dumps(stopped, indent=2) + "\n")
                # No checkpoint of the collapsed state: a resume starts from the last good one.
                raise GuardError("; ".join(f.reason for f in serious)
                                 or f"serious guard firing on rank 0 at step {step + 1}: run collapsed")
            data_pos += n_groups  # every prompt sampled is consumed, kept or not (checkpointed by save)
            if not math.isfinite(row["loss"]):
                raise GuardError(f"G-kl-explosion: non-finite loss at step {step + 1}: {row}")
            say(f"step {step + 1}/{cfg.steps} reward {row['reward_mean']:.3f} loss {row['loss']:+.4f} "
                f"ratio {row['ratio_mean']:.4f} len {row['completion_len_mean']:.1f} lr {lr:.2e} "
                f"({t3 - t0:.2f}s)" + "".join(f" {k} {v:.3f}" for k, v in row.items() if k.startswith("eval/")))
            if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == last_step:
                save(step + 1)
    finally:
        pool.close()
        if ahead is not None:
            ahead.close()

    done = bool(step_rows) and step_rows[-1]["step"] == cfg.steps
    final_dir = out_dir / FINAL_MODEL
    if done:
        trained = current_weights()  # every rank: a collective under ZeRO-3
        if dp.is_main:
            if cfg.lora_rank:
                # The adapters alone (peft format, small), then the merged model as the loadable final model.
                trained.save_pretrained(out_dir / LORA_ADAPTER)
                trained = copy.deepcopy(trained).merge_and_unload()
            if cfg.precision != "fp32":  # export fp32 weights, like the base model
                trained = copy.deepcopy(trained).float()
            trained.save_pretrained(final_dir)
    summary = _summary(step_rows, cfg, guards, done, time.perf_counter() - t_start, start_step)
    summary["health_firings"] = health_firings
    summary["data_position"] = data_pos  # curriculum prompts consumed so far (> steps * P with dynamic sampling)
    if dp.is_main:
        _write_rows(step_rows, out_dir / STEPS_FILE)
        if done:
            tok.save_pretrained(final_dir)
        (out_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    # No rank returns before rank 0's files exist, so a caller on any rank may read them.
    dp.barrier()
    return GRPOResult(final_dir, out_dir / STEPS_FILE, ckpt_dir, summary, out_dir / ROLLOUTS_FILE)


def _write_rows(rows: list[dict], path: Path) -> None:
    """Parquet of the step rows; eval columns exist only on evaluated steps, so take the union of keys
    (from_pylist would infer the schema from the first row and drop them). Written to a temporary file
    and renamed, so a kill mid-write leaves the previous file whole."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    keys = list(dict.fromkeys(k for r in rows for k in r))
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(pa.Table.from_pylist([{k: r.get(k) for k in keys} for r in rows]), tmp)
    os.replace(tmp, path)


def _read_rollouts(path: Path, up_to_step: int) -> list[dict]:
    """The rollout rows of steps 1..up_to_step already in `path` (none when it does not exist)."""
    import pyarrow.parquet as pq

    if not path.exists():
        return []
    return [r for r in pq.read_table(path).to_pylist() if r["step"] <= up_to_step]


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


def _copy_partitioned(policy, replica) -> None:
    """Copy a ZeRO-3 policy's weights into its plain replica, gathering one parameter at a time (so the
    peak is the replica plus one whole parameter). Collective: every rank calls it, in the same order."""
    import deepspeed

    with torch.no_grad():
        for src, dst in zip(policy.parameters(), replica.parameters(), strict=True):
            with deepspeed.zero.GatheredParameters([src], modifier_rank=None):
                dst.copy_(src)


def _grad_norm(engine, zero_stage: int) -> float | None:
    """Pre-clip global grad norm. Stage 0 keeps grads in .grad (DeepSpeed reports None there);
    stages >= 1 partition them, so DeepSpeed's own norm (after step) is used instead."""
    if zero_stage != 0:
        return None
    norms = [p.grad.detach().float().norm() for p in engine.module.parameters() if p.grad is not None]
    return float(torch.stack(norms).norm()) if norms else 0.0


def _summary(rows: list[dict], cfg: GRPOConfig, guards: dict[str, int], done: bool, wall_s: float,
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


# --------------------------------------------------------------------------------------------- CLI
def _main() -> None:
    import argparse

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
    # The deepspeed launcher passes --local_rank=N; LOCAL_RANK in the environment says the same.
    ap.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    main = int(os.environ.get("RANK", "0")) == 0
    torch.set_num_threads(a.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    import yaml

    from rlvr_core.curriculum import filter_by_pass_rate, order_curriculum, pass_rate_table
    from rlvr_core.data.synthetic import SyntheticSpec, make_synthetic_dataset
    from rlvr_core.stages import load_model, sample_and_verify

    overrides = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in a.set)}
    cfg = GRPOConfig(**{**GRPOConfig().model_dump(), **overrides})
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
    res = train_grpo(a.base, ds["train"], ids, a.out, cfg, template_id="qa", verifier="gsm8k", verifier_mode=None,
                     max_new_tokens=48, seed=a.seed, progress=lambda s: print(s, flush=True), evaluate=evaluate)
    report["train_wall_s"] = round(time.perf_counter() - t1, 1)
    if main:
        if res.final_model_dir.exists():
            report["trained_acc"] = greedy_acc(res.final_model_dir)
        report["summary"] = {k: v for k, v in res.summary.items() if k != "config"}
        print(json.dumps(report, indent=2))
    shutdown()


if __name__ == "__main__":
    _main()
