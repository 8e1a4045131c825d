"""The GRPO policy update: the trained model under DeepSpeed, the teacher-forced batch, and the optimizer steps.

One update (`update_policy`) on this rank's trained groups:

  * batch: prompt + completion tokens, right-padded (`build_batch`). The prompt is tokenized exactly as the
    rollout engine tokenized it (same tokenizer call, the engine's `add_special_tokens`); masks come from
    lengths, never token values (G-pad-mask). A rank that trains no group (dynamic sampling kept fewer
    groups than ranks) runs one empty completion: mask all False, loss 0, every gradient exactly 0, but the
    forward, backward and their collectives run as on every other rank.
  * micro-batches (`micro_batches`, micro_batches.py): with `micro_batch_size` and/or
    `max_tokens_per_micro_batch` set, the rank's batch is split (rows sorted by length, packed greedily,
    each micro-batch re-padded to its own widths), so the forward/backward memory follows the micro-batch.
    Ranks may plan different counts (a token budget); every rank runs the largest count (`dp.max`), padding
    with empty micro-batches (loss 0, zero gradient), because ZeRO runs collectives inside each backward.
    Unset: the whole rank batch is one micro-batch, as before.
  * log-probs: a teacher-forced forward per micro-batch, log_softmax at temperature 1 like the engine's raw
    log-probs (`sequence_logprobs`, logprobs.py): by default projected to the vocabulary in chunks of
    `logprob_chunk_size` response positions, recomputed in the backward (memory O(chunk x vocab));
    `logprob_chunk_size: 0` is the full-vocabulary reference path. With beta > 0 a frozen copy of the base
    model gives reference log-probs (with LoRA: the policy with its adapters switched off, i.e. the base
    model exactly), micro-batch by micro-batch, before the first epoch.
  * loss: `grpo_loss` per micro-batch with the rollout's log-probs as old log-probs (the behaviour
    policy's), or with `tis_cap` set the trainer's own epoch-0 log-probs and truncated importance weights
    min(exp(trainer - rollout), tis_cap) on each token's policy term (`truncated_is_weights`).
    `dlogp_reweight_c` > 0 multiplies each token's advantage by 1 + c - c * pi_old(token). The normalisers
    are the whole step's (`global_normalisers`: response tokens, sequences, Dr.GRPO's constant over all
    micro-batches and ranks), so each micro-batch's loss is its exact share: the micro-batch losses add up
    to the unsplit loss and their gradients to the unsplit gradient (every loss_agg mode is a sum over
    sequences divided by a batch-wide constant).
  * optimizer: DeepSpeed backward per micro-batch, one `step` per epoch, `epochs_per_step` epochs on the same
    batch (AdamW, warm-up + cosine, grad clipping and the ZeRO stage all come from the DeepSpeed config
    built from GRPOConfig, `ds_config`). Each rank's loss is its share of the global loss times the world
    size, since DeepSpeed averages the ranks' gradients (distributed.py).
  * gradient accumulation in DeepSpeed: the config keeps gradient_accumulation_steps 1, so `backward` never
    rescales the loss (DeepSpeed divides it by gradient_accumulation_steps when scale_wrt_gas) and the
    summed micro-batch gradients are the unsplit one. A count fixed in the config cannot follow a token
    budget (the number of micro-batches changes per step), so the boundary is set by hand with
    `engine.set_gradient_accumulation_boundary` (DeepSpeed 0.19's documented pattern): False before
    every micro-batch but the last, True before the last, then `step` once. That flag is what ZeRO-1/2
    read to keep accumulating into their gradient partitions instead of treating each backward as a whole
    step (without it ZeRO-2 kept the last micro-batch's gradient only; tests/grpo/test_micro_batches.py).
    It is left True, the gradient_accumulation_steps-1 default, for the next call. (DeepSpeed's
    `managed_gradient_accumulation: false` mode would do the same with `step` as the boundary; the flag is
    the older, documented interface.)
  * gradient checkpointing (`gradient_checkpointing`, `enable_gradient_checkpointing`): Hugging Face's,
    non-reentrant; the checkpointed layers are put in training mode for the update only (HF checkpoints
    a layer only then; the policy otherwise stays in eval mode: no dropout).
  * epoch-0 metrics, all-reduced (`_epoch0_metrics`): the micro-batches' log-probs and entropies are put
    back into the rank's (B, T) batch and grpo_loss's metrics, entropy and the log-prob mismatch between
    the rollout engine and the trainer on the sampled tokens (`logprob_mismatch/*`) are computed on it as in
    one pass; at step 1 G-logprob-temp stops the run when the mismatch exceeds the tolerance, after the
    first epoch's backward passes and before its optimizer step (so before any update).

Also here: building the policy (`build_policy`: LoRA via peft, DeepSpeed `initialize`, the optional ZeRO-3
replica and its refresh `_copy_partitioned`, the transient full copy `Policy.full_weights`).

ZeRO-3 partitions the policy and its forward hooks run collectives (each layer's weights are all-gathered
for its forward and freed after), so no rank may run it alone (rank 0 evaluating) or a data-dependent number
of times (decoding until every row stops). By default the HF engine samples the partitioned policy itself in
lockstep (every rank runs the same forward calls: rlvr_core/sampling/hf.py), so no rank holds more than its
partition plus the layers in flight; evaluation and export, which run on rank 0 alone, get a transient full
copy gathered one parameter at a time (`Policy.full_weights`), freed afterwards. With
`zero3_sampling_replica` a plain copy (`Policy.replica`) instead receives the policy's weights before each use
(`Policy.current_weights`), as a separate inference engine would: one whole model more on every rank.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

from rlvr_core.experiment.config import GRPOConfig
from rlvr_core.experiment.guards import GuardError
from rlvr_core.grpo.distributed import DataParallel, global_normalisers, reduce_loss_metrics
from rlvr_core.grpo.kl import token_kl
from rlvr_core.grpo.logprobs import sequence_logprobs
from rlvr_core.grpo.losses import mask_from_lengths, truncated_is_weights
from rlvr_core.grpo.micro_batches import empty_like, plan_micro_batches, take_rows

if TYPE_CHECKING:
    from rlvr_core.grpo.rollouts import RolloutBatch

__all__ = ["ds_config", "with_lora", "load_policy_model", "enable_gradient_checkpointing", "build_policy", "Policy", "build_batch",
           "sequence_logprobs", "TrainInputs", "train_inputs", "check_logprob_temp", "UpdateResult", "micro_batches",
           "update_policy"]


# ---------------------------------------------------------------------------------------- DeepSpeed config
def ds_config(cfg: GRPOConfig, batch_size: int, world_size: int = 1) -> dict[str, Any]:
    """The DeepSpeed config for rollout batches of `batch_size` sequences over all ranks (each rank holds
    batch_size / world_size), each trained for epochs_per_step updates. gradient_accumulation_steps stays
    1 with micro-batches too: `update_policy` sets the accumulation boundary itself (module docstring).

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
        # DeepSpeed's throughput timer starts in a forward pre-hook on the module and, from the third optimizer
        # step on, synchronises the device there: in every forward of the hf engine's decode loop, which samples
        # this module (issue 41). We time steps ourselves; the timer is off.
        "timers": {"throughput": {"enabled": False}},
    }
    if cfg.precision == "bf16":
        conf["bf16"] = {"enabled": True}
    elif cfg.precision == "fp16":
        conf["fp16"] = {"enabled": True, "initial_scale_power": 12}
    return conf


# ------------------------------------------------------------------------------------------ the policy
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


def load_policy_model(base_model_dir, cfg: GRPOConfig, seed: int) -> torch.nn.Module:
    """The policy as the stage starts it: the base model in fp32, LoRA-wrapped when lora_rank > 0."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_model_dir, local_files_only=True, dtype=torch.float32)
    return with_lora(model, cfg, seed) if cfg.lora_rank else model


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """Hugging Face gradient checkpointing (non-reentrant: no input that requires grad is needed, so LoRA
    works as it is, and it composes with ZeRO 0-3) on `model` (a PeftModel's base model), before
    DeepSpeed wraps it. Refused for a model whose config has dropout: the update switches the checkpointed
    layers to training mode (`_checkpointing_active`), and the trainer must run without dropout."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    drops = {k: v for k, v in base.config.to_dict().items()
             if ("dropout" in k or "pdrop" in k) and isinstance(v, (int, float)) and v > 0}
    if drops:
        raise ValueError(f"grpo.gradient_checkpointing needs a model without dropout; {type(base).__name__}'s "
                         f"config has {drops}")
    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


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


def _copy_partitioned(policy, replica) -> None:
    """Copy a ZeRO-3 policy's weights into its plain replica, gathering one parameter at a time (so the
    peak is the replica plus one whole parameter). Collective: every rank calls it, in the same order."""
    import deepspeed

    with torch.no_grad():
        for src, dst in zip(policy.parameters(), replica.parameters(), strict=True):
            with deepspeed.zero.GatheredParameters([src], modifier_rank=None):
                dst.copy_(src)


def _plain_copy(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """An unpartitioned model shaped like the ZeRO-3 `module` (built from its config on `device`, in its
    dtype), with `module`'s buffers; its parameters are filled by `_copy_partitioned`."""
    from transformers import AutoModelForCausalLM

    dtype = next(module.parameters()).dtype
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            plain = AutoModelForCausalLM.from_config(module.config)
    finally:
        torch.set_default_dtype(prev)
    plain.generation_config = copy.deepcopy(module.generation_config)
    with torch.no_grad():
        for (name, dst), (_, src) in zip(plain.named_buffers(), module.named_buffers(), strict=True):
            dst.copy_(src)
    return plain.eval().requires_grad_(False)


def _gathered_copy(module: torch.nn.Module, device: torch.device, want: bool) -> torch.nn.Module | None:
    """A full plain copy of the ZeRO-3 `module` where `want` (else None). Collective: every rank calls it
    and gathers each parameter in turn; only ranks that want a copy build and fill one."""
    import deepspeed

    plain = _plain_copy(module, device) if want else None
    with torch.no_grad():
        dsts = plain.parameters() if plain is not None else iter(())
        for src in module.parameters():
            with deepspeed.zero.GatheredParameters([src], modifier_rank=None):
                dst = next(dsts, None)
                if dst is not None:
                    dst.copy_(src)
    return plain


@dataclass
class Policy:
    """The trained policy on this rank and what comes with it."""

    engine: Any                          # the DeepSpeed engine (forward, backward, step, checkpoints)
    module: torch.nn.Module              # engine.module: the tensors DeepSpeed updates
    ref_model: torch.nn.Module | None    # frozen base model for beta > 0 without LoRA (never partitioned)
    replica: torch.nn.Module | None      # ZeRO-3 with zero3_sampling_replica: a plain copy, see current_weights()
    device: torch.device
    dp: DataParallel
    partitioned: bool = False            # ZeRO-3: `module` holds only this rank's partition of each weight

    @property
    def lockstep(self) -> bool:
        """Sampling runs on the partitioned module itself, so every rank must make the same forward calls."""
        return self.partitioned and self.replica is None

    def current_weights(self) -> torch.nn.Module:
        """The module the HF engine samples: the policy itself (ZeRO-3 without a replica: the partitioned
        policy, sampled in lockstep), or the replica refreshed from the partitions (collective)."""
        self.settle()
        if self.replica is None:
            return self.module
        _copy_partitioned(self.module, self.replica)
        return self.replica

    def settle(self) -> None:
        """ZeRO-3: wait for the weight all-gathers DeepSpeed prefetched and release every gathered weight,
        before weights are gathered outside a forward (a rollout engine's sync, a replica refresh, a full
        copy). A forward without a backward (the drift KL after the step, lockstep sampling) can leave a
        prefetched weight in flight on a CUDA stream; a GatheredParameters over it would read it half-gathered
        and then fail ("Cannot partition a param in flight": measured on an H200, 1.5B, after one update)."""
        if self.partitioned:
            self.engine.optimizer.empty_partition_cache()

    @contextmanager
    def full_weights(self, everywhere: bool = False) -> Iterator[torch.nn.Module | None]:
        """A module with the policy's full current weights, for work that runs a forward outside the
        lockstep (rank 0 evaluating) or needs every weight whole (export, weight snapshots). Collective under
        ZeRO-3: every rank enters it. Without a replica the copy is transient (built, gathered, freed on
        exit) and exists on rank 0 only unless `everywhere`; the other ranks get None. Without ZeRO-3 it is
        the policy itself."""
        if not self.partitioned or self.replica is not None:
            yield self.current_weights()
            return
        self.settle()
        plain = _gathered_copy(self.module, self.device, want=everywhere or self.dp.is_main)
        try:
            yield plain
        finally:
            del plain
            if self.device.type == "cuda":
                torch.cuda.empty_cache()


def build_policy(base_model_dir, cfg: GRPOConfig, seed: int, *, batch_size: int, world: int,
                 added_env: list[str]) -> Policy:
    """Load the policy, wrap it with DeepSpeed (`batch_size` sequences per step over `world` ranks), and make
    the copies that must exist before DeepSpeed partitions it. `added_env`: the launcher variables
    `_ensure_launch_env` invented (MASTER_PORT is dropped once the process group exists)."""
    model = load_policy_model(base_model_dir, cfg, seed)
    if cfg.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    ref_model = None
    if not cfg.lora_rank and cfg.beta > 0:
        # Copied before DeepSpeed wraps the policy, so ZeRO-3 never partitions it: every rank holds it whole.
        # (With LoRA the reference is the policy with its adapters switched off, see reference_logprobs.)
        ref_model = copy.deepcopy(model).eval().requires_grad_(False)
    # The ZeRO-3 sampling replica, only when asked for: by default the partitioned policy samples in lockstep.
    replica = (copy.deepcopy(model).eval().requires_grad_(False)
               if cfg.zero_stage == 3 and cfg.zero3_sampling_replica else None)
    engine, _ = _engine(model, cfg, batch_size, world)
    # The process group exists now. A MASTER_PORT we invented would otherwise be inherited by every process
    # this one starts later (a demo's next subprocess, a test's server), which would then try to listen on
    # the port this process's group already holds. (RANK, LOCAL_RANK, WORLD_SIZE stay: ZeRO-3 reads
    # LOCAL_RANK during the forward pass, and their single-process values are harmless to inherit.)
    if "MASTER_PORT" in added_env:
        os.environ.pop("MASTER_PORT", None)
    module, dev = engine.module, engine.device
    module.eval()  # no dropout anywhere: the rollout and the teacher-forced pass must see the same function
    if ref_model is not None:
        ref_model = ref_model.to(dev, torch.bfloat16 if cfg.precision == "bf16" else torch.float32)
    if replica is not None:
        replica = replica.to(dev, next(module.parameters()).dtype)  # sample in the precision that trains
    return Policy(engine, module, ref_model, replica, dev, DataParallel.current(dev), partitioned=cfg.zero_stage == 3)


# ----------------------------------------------------------------------------------------------- batching
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


def _pad_2d(values: list[list[float]], T: int) -> torch.Tensor:
    out = torch.zeros((len(values), T), dtype=torch.float32)
    for b, v in enumerate(values):
        if v:
            out[b, :len(v)] = torch.tensor(v, dtype=torch.float32)
    return out


def _masked_mean(x: torch.Tensor, m: torch.Tensor) -> float:
    n = int(m.sum())
    return float(torch.where(m, x, torch.zeros_like(x)).sum() / n) if n else float("nan")


def _masked_max(x: torch.Tensor, m: torch.Tensor) -> float:
    return float(torch.where(m, x, torch.full_like(x, -math.inf)).max()) if bool(m.any()) else float("nan")


@dataclass
class TrainInputs:
    """This rank's share of the step's trained completions, as tensors on the device."""

    batch: dict[str, torch.Tensor]   # build_batch's tensors
    adv: torch.Tensor                # (B,) advantage of each completion
    rollout_logp: torch.Tensor       # (B, T) the rollout engine's raw log-probs of the sampled tokens (0 on padding)
    mask: torch.Tensor               # (B, T) response mask, from lengths
    n_seqs: int                      # completions trained this step, all ranks (the sequence normaliser)


def _groups_batch(groups: list, tokenizer: Any, sampler: Any, device: torch.device):
    """(batch, rollout log-probs (B, T), mask) of these groups' completions on `device`; with no group, one
    empty completion (mask all False), so the forwards and their collectives still run on this rank."""
    samples = [x for g in groups for x in g.samples]
    if samples:
        # Prompt tokens exactly as the engine encoded them (same tokenizer call and flag).
        enc = [tokenizer(g.prompt, add_special_tokens=sampler.add_special_tokens)["input_ids"] for g in groups]
        batch = build_batch([e for e, g in zip(enc, groups) for _ in g.samples],
                            [x.token_ids for x in samples], sampler.pad_token_id)
        old_rows = [x.logprobs for x in samples]
    else:
        batch, old_rows = build_batch([[sampler.pad_token_id]], [[]], sampler.pad_token_id), [[]]
    batch = {k: v.to(device) for k, v in batch.items()}
    T = batch["targets"].shape[1]
    return batch, _pad_2d(old_rows, T).to(device), mask_from_lengths(batch["lengths"], T)


def train_inputs(rollouts: "RolloutBatch", adv_all: torch.Tensor, *, tokenizer: Any, sampler: Any,
                 device: torch.device) -> TrainInputs:
    """The trained groups this rank holds (`rollouts.mine()`), with their rows of the (K, M) advantages.
    A rank that trains no group (dynamic sampling kept fewer than the world size, or none) gets one empty
    completion: the loss is 0 and every gradient exactly 0, but the forward and backward (and their
    collectives) run as on every other rank."""
    mine = rollouts.mine()
    adv = (torch.cat([adv_all[j, :len(g.samples)] for j, g in mine]) if mine else torch.zeros(1)).to(device)
    batch, old, mask = _groups_batch([g for _, g in mine], tokenizer, sampler, device)
    return TrainInputs(batch, adv, old, mask, int(rollouts.sizes[rollouts.selected].sum()))


def sampled_kl(policy: "Policy", cfg: GRPOConfig, rollouts: "RolloutBatch", *, tokenizer: Any, sampler: Any,
               device: torch.device) -> dict[str, float]:
    """kl_ref_mean / kl_ref_max on the completions the step sampled, for a step that trained none (dynamic
    sampling dropped every group, as a collapsing run does): the KL detectors' window keeps filling exactly
    when it matters. The policy side is the rollout's own log-probs (the weights that sampled them), so this
    costs one reference forward over at most a normal step's groups (the first round's). Collective: every
    rank calls it on the same steps. NaN without a reference model."""
    groups = [g for i, g in sorted(rollouts.local.items()) if i < cfg.prompts_per_step]
    batch, logp, mask = _groups_batch(groups, tokenizer, sampler, device)
    ref = reference_logprobs(policy, cfg, batch)
    if ref is None:
        return {"kl_ref_mean": float("nan"), "kl_ref_max": float("nan")}
    kl = token_kl(logp.float(), ref.float(), cfg.kl_estimator)[mask]
    total, n = policy.dp.sum([float(kl.sum()) if kl.numel() else 0.0, float(kl.numel())])
    top = policy.dp.max([float(kl.max()) if kl.numel() else -math.inf])[0]
    return {"kl_ref_mean": total / n if n else float("nan"), "kl_ref_max": top if n else float("nan")}


# ------------------------------------------------------------------------------------------- the update
def reference_logprobs(policy: Policy, cfg: GRPOConfig, batch: dict) -> torch.Tensor | None:
    """Log-probs of the sampled tokens under the reference (the base model), or None without one."""
    chunk = cfg.logprob_chunk_size
    if policy.ref_model is not None:
        with torch.no_grad():
            return sequence_logprobs(policy.ref_model, batch, chunk_size=chunk, pack=cfg.pack_sequences)[0]
    if cfg.lora_rank and cfg.beta > 0:
        with torch.no_grad(), policy.module.disable_adapter():  # the base model, exactly
            return sequence_logprobs(policy.module, batch, chunk_size=chunk, pack=cfg.pack_sequences)[0]
    return None


def check_logprob_temp(cfg: GRPOConfig, *, step: int, n_tokens: int, diff: float, guard_tol: float) -> None:
    """G-logprob-temp: at step 1, before any update, the trainer's log-probs of the sampled tokens must equal
    the rollout engine's (mean |diff| <= guard_tol). No token trained: nothing to compare."""
    if step == 0 and n_tokens and not diff <= guard_tol:
        raise GuardError(
            f"G-logprob-temp: trainer log-probs differ from the rollout's by {diff:.4g} (mean abs, "
            f"tolerance {guard_tol:g}) on the same sampled tokens at step 1. The rollout engine "
            f"returns raw log-probs (temperature 1; sampling temperature {cfg.temperature:g}); "
            f"the trainer computed them at temperature {cfg.logprob_temperature:g}.")


@dataclass
class UpdateResult:
    metrics: dict[str, float]  # first epoch, all ranks: grpo_loss's, entropy, logprob_abs_diff,
    #                            logprob_mismatch/*, and tis/* with tis_cap
    loss_last: float           # the last epoch's loss, all ranks
    lr: float                  # the lr the last epoch's update used
    grad_norm: float           # the last epoch's pre-clip global grad norm
    n_tokens: int              # response tokens trained, all ranks
    has_reference: bool        # KL metrics are meaningful (a reference model existed)
    drift: dict[str, float] | None = None  # drift/kl_mean, drift/kl_max on steps that measured it (`drift_kl`)


def _first_epoch_metrics(dp: DataParallel, m: dict, logp: torch.Tensor, ent: torch.Tensor, inputs: TrainInputs,
                         tis: dict | None, guard_tol: float, n_tok: int) -> dict[str, float]:
    """grpo_loss's metrics plus entropy and the rollout-vs-trainer log-prob mismatch, reduced over ranks
    (token means re-weighted by token counts, maxima maxed; distributed.reduce_loss_metrics)."""
    mask = inputs.mask
    diff = (logp.detach() - inputs.rollout_logp).abs()
    local = {**{k: float(v) for k, v in m.items()},
             "logprob_abs_diff": _masked_mean(diff, mask),
             "logprob_mismatch/max_abs": _masked_max(diff, mask),
             "logprob_mismatch/share_over_tol": _masked_mean((diff > guard_tol).float(), mask),
             "entropy": _masked_mean(ent, mask),
             **{k: float(v) for k, v in (tis or {}).items()}}
    first = reduce_loss_metrics(dp, local, int(mask.sum()), n_tok)
    first["logprob_mismatch/mean_abs"] = first["logprob_abs_diff"]
    return first


def micro_batches(cfg: GRPOConfig, dp: DataParallel, inputs: TrainInputs) -> tuple[list, list[TrainInputs]]:
    """This rank's micro-batches: (plan, inputs of each). A plan entry is None for the whole unsplit batch,
    the list of rows a micro-batch holds, or [] for an empty one. Collective when a limit is set: every rank
    ends up with the same count (the largest), the short ones padded with empty micro-batches."""
    if not cfg.micro_batch_size and not cfg.max_tokens_per_micro_batch:
        return [None], [inputs]
    lens = [int(x) for x in inputs.batch["attention_mask"].sum(1).tolist()]
    plan: list = plan_micro_batches(lens, micro_batch_size=cfg.micro_batch_size,
                                    max_tokens=cfg.max_tokens_per_micro_batch)
    n = int(dp.max([float(len(plan))])[0])
    plan += [[] for _ in range(n - len(plan))]
    return plan, [take_rows(inputs, rows) if rows else empty_like(inputs) for rows in plan]


def _assemble(plan: list, parts: list[torch.Tensor | None], like: torch.Tensor) -> torch.Tensor | None:
    """Per-micro-batch (B_i, T_i) values put back at their rows of the rank's (B, T) batch (0 elsewhere)."""
    if parts[0] is None or plan == [None]:
        return parts[0]
    out = torch.zeros_like(like)
    for rows, v in zip(plan, parts):
        if rows:
            out[torch.tensor(rows, device=out.device), :v.shape[1]] = v.detach().to(out.dtype)
    return out


@contextlib.contextmanager
def _checkpointing_active(module: torch.nn.Module, enabled: bool):
    """Hugging Face checkpoints a layer only while that layer is in training mode, and the trainer keeps the
    policy in eval mode (no dropout). With gradient_checkpointing, only the checkpointed layers' own flag
    is set for the update: their submodules (dropout, attention) stay in eval mode, and `build_policy`
    refused a model whose config has dropout, so nothing else changes."""
    layers = [m for m in module.modules() if getattr(m, "gradient_checkpointing", False) is True] if enabled else []
    for m in layers:
        m.training = True
    try:
        yield
    finally:
        for m in layers:
            m.training = False


def update_policy(policy: Policy, cfg: GRPOConfig, inputs: TrainInputs, *, loss_fn: Callable, step: int,
                  norm_len: int | None, guard_tol: float) -> UpdateResult:
    """`epochs_per_step` DeepSpeed updates on this rank's trained completions (collective: every rank calls
    it once per step). loss_fn: `grpo_loss` (passed in by the trainer). Raises GuardError (G-logprob-temp)
    at step 0 before any update when the trainer's log-probs disagree with the rollout's."""
    engine, dp, mask = policy.engine, policy.dp, inputs.mask
    policy.module.eval()  # HFEngine calls .eval() too; keep it explicit
    plan, parts = micro_batches(cfg, dp, inputs)
    refs = [reference_logprobs(policy, cfg, p.batch) for p in parts]
    # The whole step's token and sequence counts: the micro-batches' and ranks' losses add up to the
    # 1-process, 1-pass loss, and so do their gradients.
    norm = global_normalisers(dp, int(mask.sum()), max(inputs.n_seqs, 1))
    kw = dict(beta=cfg.beta, kl_estimator=cfg.kl_estimator, policy_loss=cfg.policy_loss, clip_low=cfg.clip_low,
              clip_high=cfg.clip_high, agg_mode=cfg.loss_agg, norm_len=norm_len, lowprob_c=cfg.dlogp_reweight_c,
              num_tokens=norm["num_tokens"], num_seqs=norm["num_seqs"])
    olds, extras = [p.rollout_logp for p in parts], [{} for _ in parts]
    first: dict[str, float] = {}
    sampled: list[torch.Tensor] = []  # the first epoch's log-probs: the weights that sampled (on-policy)
    with _checkpointing_active(policy.module, cfg.gradient_checkpointing):
        for ep in range(cfg.epochs_per_step):
            loss_sum, seen = None, []  # on the device: one device->host copy per update, not per micro-batch
            for i, part in enumerate(parts):
                if len(parts) > 1:  # gradients accumulate until the last micro-batch (module docstring)
                    engine.set_gradient_accumulation_boundary(i == len(parts) - 1)
                logp, ent = sequence_logprobs(engine, part.batch, temperature=cfg.logprob_temperature,
                                              with_entropy=(ep == 0), chunk_size=cfg.logprob_chunk_size,
                                              pack=cfg.pack_sequences)
                if ep == 0 and cfg.tis_cap is not None:
                    # TIS: the ratio's old log-probs are the trainer's own (the weights that sampled, before any
                    # update of this step); the engine-vs-trainer gap goes into capped per-token weights instead.
                    olds[i] = logp.detach()
                    extras[i] = {"is_weights": truncated_is_weights(olds[i], part.rollout_logp, part.mask,
                                                                    cfg.tis_cap)[0]}
                loss, m = loss_fn(logp, olds[i], part.adv, part.mask, ref_logp=refs[i], **kw, **extras[i])
                part_loss = m["loss"].detach().float()
                loss_sum = part_loss if loss_sum is None else loss_sum + part_loss
                if ep == 0:
                    seen.append((logp.detach(), ent, m))
                    sampled.append(logp.detach())
                # `loss` is this micro-batch's share of the global loss; DeepSpeed divides the summed gradients
                # by the world size, so scale it back up to get the single-process gradient.
                engine.backward(loss * dp.world)
            if ep == 0:
                first = _epoch0_metrics(cfg, dp, plan, seen, refs, inputs, loss_fn, kw, guard_tol, norm["n_tokens"])
                check_logprob_temp(cfg, step=step, n_tokens=norm["n_tokens"], diff=first["logprob_abs_diff"],
                                   guard_tol=guard_tol)
            lr = float(engine.optimizer.param_groups[0]["lr"])
            grad_norm = _grad_norm(engine, cfg.zero_stage)  # stage 0: from .grad before the step
            engine.step()
            if grad_norm is None:
                gn = engine.get_global_grad_norm()
                grad_norm = float(gn) if gn is not None else float("nan")
    drift = drift_kl(policy, cfg, parts, sampled) if measure_drift(cfg, step) else None
    return UpdateResult(first, dp.sum([float(loss_sum)])[0], lr, grad_norm, norm["n_tokens"], refs[0] is not None,
                        drift)


def measure_drift(cfg: GRPOConfig, step: int) -> bool:
    """Whether step `step` (0-based) measures the beta-0 drift signal: every `drift_every` steps, the first included."""
    return cfg.drift_active() and step % cfg.drift_every == 0


def drift_kl(policy: Policy, cfg: GRPOConfig, parts: list[TrainInputs], sampled: list[torch.Tensor]) -> dict[str, float]:
    """The drift signal without a reference model: per-token k3 KL(pi_before || pi_after) on the step's trained
    completions, pi_before = the trainer's first-epoch log-probs (the weights that sampled them, on-policy) and
    pi_after = one no-grad forward under the updated weights. Token mean and max over every rank (collective)."""
    total, n, peak = 0.0, 0, -math.inf
    with torch.no_grad():
        for part, before in zip(parts, sampled):
            after = sequence_logprobs(policy.engine, part.batch, temperature=cfg.logprob_temperature,
                                      chunk_size=cfg.logprob_chunk_size, pack=cfg.pack_sequences)[0]
            kl = token_kl(before, after, "k3")
            m = part.mask
            total += float(torch.where(m, kl, torch.zeros_like(kl)).sum())
            n += int(m.sum())
            if bool(m.any()):
                peak = max(peak, _masked_max(kl, m))
    s, cnt = policy.dp.sum([total, float(n)])
    mx = policy.dp.max([peak])[0]
    return {"drift/kl_mean": s / cnt if cnt else float("nan"), "drift/kl_max": mx if cnt else float("nan")}


def _epoch0_metrics(cfg: GRPOConfig, dp: DataParallel, plan: list, seen: list, refs: list, inputs: TrainInputs,
                    loss_fn: Callable, kw: dict, guard_tol: float, n_tok: int) -> dict[str, float]:
    """The first epoch's metrics, computed as in one pass: the micro-batches' log-probs, entropies and
    reference log-probs are put back into the rank's (B, T) batch and, when the batch was split, `loss_fn`
    is evaluated on it once more (no gradient; (B, T) numbers only), so every metric (means, maxima, clip
    fractions, KL, TIS) is the unsplit one whatever the split. `seen`: (log-probs, entropies, loss_fn's
    metrics) of each micro-batch."""
    logp = _assemble(plan, [lp for lp, _, _ in seen], inputs.rollout_logp)
    ent = _assemble(plan, [e for _, e, _ in seen], inputs.rollout_logp)
    old, extra, tis = inputs.rollout_logp, {}, None
    if cfg.tis_cap is not None:
        old = logp
        w, tis = truncated_is_weights(logp, inputs.rollout_logp, inputs.mask, cfg.tis_cap)
        extra = {"is_weights": w}
    if plan == [None]:  # unsplit: the training call's own metrics, as before micro-batches existed
        m = seen[0][2]
    else:
        with torch.no_grad():
            _, m = loss_fn(logp, old, inputs.adv, inputs.mask, ref_logp=_assemble(plan, refs, inputs.rollout_logp),
                           **kw, **extra)
    return _first_epoch_metrics(dp, m, logp, ent, inputs, tis, guard_tol, n_tok)


def _grad_norm(engine, zero_stage: int) -> float | None:
    """Pre-clip global grad norm. Stage 0 keeps grads in .grad (DeepSpeed reports None there);
    stages >= 1 partition them, so DeepSpeed's own norm (after step) is used instead."""
    if zero_stage != 0:
        return None
    norms = [p.grad.detach().float().norm() for p in engine.module.parameters() if p.grad is not None]
    return float(torch.stack(norms).norm()) if norms else 0.0
