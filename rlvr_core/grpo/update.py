"""The GRPO policy update: the trained model under DeepSpeed, the teacher-forced batch, and the optimizer steps.

One update (`update_policy`) on this rank's trained groups:

  * batch: prompt + completion tokens, right-padded (`build_batch`). The prompt is tokenized exactly as the
    rollout engine tokenized it (same tokenizer call, the engine's `add_special_tokens`); masks come from
    lengths, never token values (G-pad-mask). A rank that trains no group (dynamic sampling kept fewer
    groups than ranks) runs one empty completion: mask all False, loss 0, every gradient exactly 0, but the
    forward, backward and their collectives run as on every other rank.
  * log-probs: one teacher-forced forward, log_softmax at temperature 1 like the engine's raw log-probs
    (`sequence_logprobs`). With beta > 0 a frozen copy of the base model gives reference log-probs (with
    LoRA: the policy with its adapters switched off, i.e. the base model exactly).
  * loss: `grpo_loss` with the rollout's log-probs as old log-probs (the behaviour policy's), or with
    `tis_cap` set the trainer's own epoch-0 log-probs and truncated importance weights
    min(exp(trainer - rollout), tis_cap) on each token's policy term (`truncated_is_weights`).
    `dlogp_reweight_c` > 0 multiplies each token's advantage by 1 + c - c * pi_old(token).
  * optimizer: DeepSpeed backward/step, `epochs_per_step` times on the same batch (AdamW, warm-up + cosine,
    grad clipping and the ZeRO stage all come from the DeepSpeed config built from GRPOConfig, `ds_config`).
    Each rank's loss is its share of the global loss (global token / sequence counts) times the world size,
    since DeepSpeed averages the ranks' gradients (distributed.py).
  * epoch-0 metrics, all-reduced: grpo_loss's, entropy, and the log-prob mismatch between the rollout engine
    and the trainer on the sampled tokens (`logprob_mismatch/*`; at step 1 G-logprob-temp stops the run
    when its mean exceeds the tolerance, before any update).

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
from rlvr_core.grpo.losses import mask_from_lengths, truncated_is_weights

if TYPE_CHECKING:
    from rlvr_core.grpo.rollouts import RolloutBatch

__all__ = ["ds_config", "with_lora", "load_policy_model", "build_policy", "Policy", "build_batch",
           "sequence_logprobs", "TrainInputs", "train_inputs", "check_logprob_temp", "UpdateResult", "update_policy"]


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
        if self.replica is None:
            return self.module
        _copy_partitioned(self.module, self.replica)
        return self.replica

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


def train_inputs(rollouts: "RolloutBatch", adv_all: torch.Tensor, *, tokenizer: Any, sampler: Any,
                 device: torch.device) -> TrainInputs:
    """The trained groups this rank holds (`rollouts.mine()`), with their rows of the (K, M) advantages."""
    mine = rollouts.mine()
    samples = [x for _, g in mine for x in g.samples]
    adv = (torch.cat([adv_all[j, :len(g.samples)] for j, g in mine]) if mine else torch.zeros(0)).to(device)
    if samples:
        # Prompt tokens exactly as the engine encoded them (same tokenizer call and flag).
        enc = [tokenizer(g.prompt, add_special_tokens=sampler.add_special_tokens)["input_ids"] for _, g in mine]
        batch = build_batch([e for e, (_, g) in zip(enc, mine) for _ in g.samples],
                            [x.token_ids for x in samples], sampler.pad_token_id)
        old_rows = [x.logprobs for x in samples]
    else:
        # This rank trains no group (dynamic sampling kept fewer than the world size, or none): one empty
        # completion, mask all False, so the loss is 0 and every gradient exactly 0, but the forward and
        # backward (and their collectives) run as on every other rank.
        batch = build_batch([[sampler.pad_token_id]], [[]], sampler.pad_token_id)
        adv, old_rows = torch.zeros(1, device=device), [[]]
    batch = {k: v.to(device) for k, v in batch.items()}
    T = batch["targets"].shape[1]
    return TrainInputs(batch, adv, _pad_2d(old_rows, T).to(device), mask_from_lengths(batch["lengths"], T),
                       int(rollouts.sizes[rollouts.selected].sum()))


# ------------------------------------------------------------------------------------------- the update
def reference_logprobs(policy: Policy, cfg: GRPOConfig, batch: dict) -> torch.Tensor | None:
    """Log-probs of the sampled tokens under the reference (the base model), or None without one."""
    if policy.ref_model is not None:
        with torch.no_grad():
            return sequence_logprobs(policy.ref_model, batch)[0]
    if cfg.lora_rank and cfg.beta > 0:
        with torch.no_grad(), policy.module.disable_adapter():  # the base model, exactly
            return sequence_logprobs(policy.module, batch)[0]
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


def update_policy(policy: Policy, cfg: GRPOConfig, inputs: TrainInputs, *, loss_fn: Callable, step: int,
                  norm_len: int | None, guard_tol: float) -> UpdateResult:
    """`epochs_per_step` DeepSpeed updates on this rank's trained completions (collective: every rank calls
    it once per step). loss_fn: `grpo_loss` (passed in by the trainer). Raises GuardError (G-logprob-temp)
    at step 0 before any update when the trainer's log-probs disagree with the rollout's."""
    engine, dp, mask = policy.engine, policy.dp, inputs.mask
    policy.module.eval()  # HFEngine calls .eval() too; keep it explicit
    ref_logp = reference_logprobs(policy, cfg, inputs.batch)
    # The whole step's token and sequence counts: the ranks' losses then add up to the 1-process loss.
    norm = global_normalisers(dp, int(mask.sum()), max(inputs.n_seqs, 1))
    old_logp, tis, extra, first = inputs.rollout_logp, None, {}, {}
    for ep in range(cfg.epochs_per_step):
        logp, ent = sequence_logprobs(engine, inputs.batch, temperature=cfg.logprob_temperature,
                                      with_entropy=(ep == 0))
        if ep == 0 and cfg.tis_cap is not None:
            # TIS: the ratio's old log-probs are the trainer's own (the weights that sampled, before any update
            # of this step); the engine-vs-trainer gap goes into capped per-token weights instead.
            old_logp = logp.detach()
            w, tis = truncated_is_weights(old_logp, inputs.rollout_logp, mask, cfg.tis_cap)
            extra = {"is_weights": w}
        loss, m = loss_fn(logp, old_logp, inputs.adv, mask, ref_logp=ref_logp, beta=cfg.beta,
                          kl_estimator=cfg.kl_estimator, clip_low=cfg.clip_low, clip_high=cfg.clip_high,
                          agg_mode=cfg.loss_agg, norm_len=norm_len, lowprob_c=cfg.dlogp_reweight_c,
                          num_tokens=norm["num_tokens"], num_seqs=norm["num_seqs"], **extra)
        if ep == 0:
            first = _first_epoch_metrics(dp, m, logp, ent, inputs, tis, guard_tol, norm["n_tokens"])
            check_logprob_temp(cfg, step=step, n_tokens=norm["n_tokens"], diff=first["logprob_abs_diff"],
                               guard_tol=guard_tol)
        lr = float(engine.optimizer.param_groups[0]["lr"])
        # `loss` is this rank's share of the global loss; DeepSpeed divides the summed gradients by the world
        # size, so scale it back up to get the single-process gradient.
        engine.backward(loss * dp.world)
        grad_norm = _grad_norm(engine, cfg.zero_stage)  # stage 0: from .grad before the step
        engine.step()
        if grad_norm is None:
            gn = engine.get_global_grad_norm()
            grad_norm = float(gn) if gn is not None else float("nan")
    return UpdateResult(first, dp.sum([float(m["loss"])])[0], lr, grad_norm, norm["n_tokens"], ref_logp is not None)


def _grad_norm(engine, zero_stage: int) -> float | None:
    """Pre-clip global grad norm. Stage 0 keeps grads in .grad (DeepSpeed reports None there);
    stages >= 1 partition them, so DeepSpeed's own norm (after step) is used instead."""
    if zero_stage != 0:
        return None
    norms = [p.grad.detach().float().norm() for p in engine.module.parameters() if p.grad is not None]
    return float(torch.stack(norms).norm()) if norms else 0.0
