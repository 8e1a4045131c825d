"""The trained policy on this rank: the model under DeepSpeed and what comes with it (update.py runs the updates).

`build_policy` loads the base model (LoRA adapters via peft when lora_rank > 0, gradient checkpointing when
asked), copies the frozen reference model for beta > 0 before DeepSpeed wraps the policy, initialises
DeepSpeed with the config built from GRPOConfig (`ds_config`), and makes the optional ZeRO-3 sampling replica;
`Policy` holds them, with `current_weights` (the module the HF engine samples; the replica refreshed by
`_copy_partitioned`) and `full_weights` (a transient full copy of a partitioned policy).

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

import copy
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from rlvr_core.experiment.config import GRPOConfig
from rlvr_core.grpo.distributed import DataParallel

__all__ = ["ds_config", "with_lora", "load_policy_model", "enable_gradient_checkpointing", "build_policy", "Policy"]


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
        raise ValueError(f"grpo.memory.gradient_checkpointing needs a model without dropout; {type(base).__name__}'s "
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
    if cfg.memory.gradient_checkpointing:
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
