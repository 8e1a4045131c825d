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
    policy's), or with `tis_cap` set the trainer's own epoch-0 log-probs and rollout-correction weights on each
    token's policy term (`correction_weights`, rollout_correction.py; `tis_mode`: truncated or masked, per
    token or per sequence). The mask modes reject tokens: a no-grad forward first (`_rejecting_pass`) finds
    them, and they leave the loss mask and the step's normalisers (`_loss_normalisers`).
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

The policy itself (DeepSpeed engine, LoRA, ZeRO-3 copies) is built in policy.py.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch

from rlvr_core.experiment.config import GRPOConfig
from rlvr_core.experiment.guards import GuardError
from rlvr_core.grpo.distributed import DataParallel, global_normalisers, reduce_loss_metrics
from rlvr_core.grpo.kl import token_kl
from rlvr_core.environments.advantages import token_advantages, turn_to_go_advantages
from rlvr_core.grpo.distillation import distillation_loss
from rlvr_core.grpo.logprobs import full_vocab_logprobs, sequence_logprobs
from rlvr_core.environments.trajectory import check_aligned
from rlvr_core.grpo.losses import mask_from_lengths
from rlvr_core.grpo.rollout_correction import correction_weights
from rlvr_core.grpo.micro_batches import empty_like, plan_micro_batches, take_rows
from rlvr_core.grpo.policy import Policy

if TYPE_CHECKING:
    from rlvr_core.grpo.rollouts import RolloutBatch

__all__ = ["build_batch", "TrainInputs", "train_inputs", "check_logprob_temp", "UpdateResult", "micro_batches",
           "update_policy"]


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
    adv: torch.Tensor                # (B,) advantage of each completion, or (B, T) per token (turn_advantage: to_go)
    rollout_logp: torch.Tensor       # (B, T) the rollout engine's raw log-probs of the sampled tokens (0 on padding)
    mask: torch.Tensor               # (B, T) response mask, from lengths
    n_seqs: int                      # completions trained this step, all ranks (the sequence normaliser)


def _prompt_tokens(groups: list, tokenizer: Any, sampler: Any) -> list[list[int]]:
    """Each completion's prompt ids: the ids the engine reports it sampled from (token-in/token-out; a multi-turn
    trajectory's first prompt), else the prompt encoded exactly as the engine encoded it (same call and flag)."""
    out = []
    for g in groups:
        encoded = None
        for x in g.samples:
            if x.prompt_token_ids is not None:
                out.append(list(x.prompt_token_ids))
                continue
            if encoded is None:
                encoded = tokenizer(g.prompt, add_special_tokens=sampler.add_special_tokens)["input_ids"]
            out.append(encoded)
    return out


def loss_mask(samples: list, lengths: torch.Tensor, T: int) -> torch.Tensor:
    """(B, T) tokens the loss sees: each completion's length, and within a multi-turn trajectory only the ids the
    policy wrote (`Sample.loss_mask`: 0 on observations and template tokens). Ids, log-probs and mask must have
    one length (TRL #5145)."""
    mask = mask_from_lengths(lengths, T)
    for b, x in enumerate(samples):
        if x.loss_mask is None:
            continue
        check_aligned(x.token_ids, x.logprobs, x.loss_mask, where=f"completion {b} ({x.prompt_id})")
        if x.loss_mask:
            mask[b, :len(x.loss_mask)] &= torch.tensor(x.loss_mask, dtype=torch.bool, device=mask.device)
    return mask


def _groups_batch(groups: list, tokenizer: Any, sampler: Any, device: torch.device):
    """(batch, rollout log-probs (B, T), mask) of these groups' completions on `device`; with no group, one
    empty completion (mask all False), so the forwards and their collectives still run on this rank."""
    samples = [x for g in groups for x in g.samples]
    if samples:
        batch = build_batch(_prompt_tokens(groups, tokenizer, sampler), [x.token_ids for x in samples],
                            sampler.pad_token_id)
        old_rows = [x.logprobs for x in samples]
    else:
        batch, old_rows = build_batch([[sampler.pad_token_id]], [[]], sampler.pad_token_id), [[]]
    batch = {k: v.to(device) for k, v in batch.items()}
    T = batch["targets"].shape[1]
    return batch, _pad_2d(old_rows, T).to(device), loss_mask(samples, batch["lengths"], T).to(device)


def train_inputs(rollouts: "RolloutBatch", adv_all: torch.Tensor, *, tokenizer: Any, sampler: Any,
                 device: torch.device) -> TrainInputs:
    """The trained groups this rank holds (`rollouts.mine()`), with their rows of the (K, M) advantages.
    A rank that trains no group (dynamic sampling kept fewer than the world size, or none) gets one empty
    completion: the loss is 0 and every gradient exactly 0, but the forward and backward (and their
    collectives) run as on every other rank."""
    mine = rollouts.mine()
    adv = (torch.cat([adv_all[j, :len(g.samples)] for j, g in mine]) if mine else torch.zeros(1)).to(device)
    batch, old, mask = _groups_batch([g for _, g in mine], tokenizer, sampler, device)
    if mine and getattr(sampler, "turn_advantage", "outcome") == "to_go":  # per-turn credit (environments)
        adv = turn_token_advantages([g for _, g in mine], mask.shape[1]).to(device)
    return TrainInputs(batch, adv, old, mask, int(rollouts.sizes[rollouts.selected].sum()))


def turn_token_advantages(groups: list, T: int) -> torch.Tensor:
    """(B, T) advantages of multi-turn trajectories under `environment.turn_advantage: to_go`: each group's
    `turn_to_go_advantages` (its shaped outcome rewards and the turns' own rewards) on each turn's model ids, 0 on
    the environment's (rlvr_core/environments/advantages.py)."""
    rows = []
    for g in groups:
        logs = [x.env or {} for x in g.samples]
        turns = [[t["tokens"] for t in e.get("turn_log", ())] for e in logs]
        given = [list(e.get("turn_rewards", ())) for e in logs]  # a turn a budget cut has none: None
        rewards = [r + [None] * (len(n) - len(r)) for r, n in zip(given, turns)]
        outcomes = [r + p for r, p in zip(g.stats.rewards, g.stats.penalties)]
        per_turn = turn_to_go_advantages(outcomes, rewards)
        rows += [token_advantages(a, n, x.loss_mask or [1] * len(x.token_ids))
                 for a, n, x in zip(per_turn, turns, g.samples)]
    return _pad_2d(rows, T)


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
    chunk = cfg.memory.logprob_chunk_size
    if policy.ref_model is not None:
        with torch.no_grad():
            return sequence_logprobs(policy.ref_model, batch, chunk_size=chunk, pack=cfg.memory.pack_sequences)[0]
    if cfg.lora_rank and cfg.beta > 0:
        with torch.no_grad(), policy.module.disable_adapter():  # the base model, exactly
            return sequence_logprobs(policy.module, batch, chunk_size=chunk, pack=cfg.memory.pack_sequences)[0]
    return None


def check_logprob_temp(cfg: GRPOConfig, *, step: int, n_tokens: int, diff: float, guard_tol: float) -> None:
    """G-logprob-temp: at step 1, before any update, the trainer's log-probs of the sampled tokens must equal
    the rollout engine's (mean |diff| <= guard_tol). No token trained: nothing to compare."""
    if step == 0 and n_tokens and not diff <= guard_tol:
        raise GuardError(
            f"G-logprob-temp: trainer log-probs differ from the rollout's by {diff:.4g} (mean abs, "
            f"tolerance {guard_tol:g}) on the same sampled tokens at step 1. The rollout engine "
            f"returns raw log-probs (temperature 1; sampling temperature {cfg.temperature:g}); "
            f"the trainer computed them at temperature {cfg.logprob_temperature:g}.", guard="G-logprob-temp", step=1)


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
    if not cfg.memory.micro_batch_size and not cfg.memory.max_tokens_per_micro_batch:
        return [None], [inputs]
    lens = [int(x) for x in inputs.batch["attention_mask"].sum(1).tolist()]
    plan: list = plan_micro_batches(lens, micro_batch_size=cfg.memory.micro_batch_size,
                                    max_tokens=cfg.memory.max_tokens_per_micro_batch)
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
                  norm_len: int | None, guard_tol: float, teacher: Any = None) -> UpdateResult:
    """`epochs_per_step` DeepSpeed updates on this rank's trained completions (collective: every rank calls
    it once per step). loss_fn: `grpo_loss` (passed in by the trainer). Raises GuardError (G-logprob-temp)
    at step 0 before any update when the trainer's log-probs disagree with the rollout's. `teacher`: on-policy
    distillation's teacher (`grpo.distill_teacher`, distillation.py `LocalTeacher` or `ServerTeacher`): each
    micro-batch's loss becomes (1 - w) x loss_fn's + w x the reverse KL to the teacher's log-probs of the same
    tokens (its `estimator`: full distributions or the sampled tokens')."""
    engine, dp, mask = policy.engine, policy.dp, inputs.mask
    policy.module.eval()  # HFEngine calls .eval() too; keep it explicit
    plan, parts = micro_batches(cfg, dp, inputs)
    refs = [reference_logprobs(policy, cfg, p.batch) for p in parts]
    # The whole step's token and sequence counts: the micro-batches' and ranks' losses add up to the
    # 1-process, 1-pass loss, and so do their gradients.
    norm = global_normalisers(dp, int(mask.sum()), max(inputs.n_seqs, 1))
    kw = dict(beta=cfg.beta, kl_estimator=cfg.kl_estimator, policy_loss=cfg.policy_loss, clip_low=cfg.clip_low,
              clip_high=cfg.clip_high, agg_mode=cfg.loss_agg, norm_len=norm_len, lowprob_c=cfg.dlogp_reweight_c,
              num_tokens=norm["num_tokens"], num_seqs=norm["num_seqs"], loss_params=cfg.policy_loss_params())
    olds, extras, masks = [p.rollout_logp for p in parts], [{} for _ in parts], [p.mask for p in parts]
    if rejects_tokens(cfg):  # the rejected tokens leave the loss and its denominators before any backward
        olds, extras, masks = _rejecting_pass(policy, cfg, parts)
    kw.update(_loss_normalisers(dp, masks))
    teach = [teacher.logprobs(p.batch, p.mask, policy.device) for p in parts] if teacher is not None else None
    full_vocab = teacher is not None and teacher.estimator == "full"
    distilled = _Distilled(cfg.distill_weight, teacher.estimator if teacher is not None else "full")
    first: dict[str, float] = {}
    sampled: list[torch.Tensor] = []  # the first epoch's log-probs: the weights that sampled (on-policy)
    with _checkpointing_active(policy.module, cfg.memory.gradient_checkpointing):
        for ep in range(cfg.epochs_per_step):
            loss_sum, seen = None, []  # on the device: one device->host copy per update, not per micro-batch
            for i, part in enumerate(parts):
                if len(parts) > 1:  # gradients accumulate until the last micro-batch (module docstring)
                    engine.set_gradient_accumulation_boundary(i == len(parts) - 1)
                if not full_vocab:
                    logp, ent = sequence_logprobs(engine, part.batch, temperature=cfg.logprob_temperature,
                                                  with_entropy=(ep == 0), chunk_size=cfg.memory.logprob_chunk_size,
                                                  pack=cfg.memory.pack_sequences)
                else:  # the whole distribution, for the reverse KL to the teacher's
                    logp, ent, logp_all = full_vocab_logprobs(engine, part.batch, temperature=cfg.logprob_temperature,
                                                              with_entropy=(ep == 0))
                if ep == 0 and cfg.tis_cap is not None and not rejects_tokens(cfg):
                    # TIS: the ratio's old log-probs are the trainer's own (the weights that sampled, before any
                    # update of this step); the engine-vs-trainer gap goes into truncated weights instead.
                    olds[i] = logp.detach()
                    extras[i] = {"is_weights": correction_weights(olds[i], part.rollout_logp, part.mask,
                                                                  **correction_kw(cfg))[0]}
                loss, m = loss_fn(logp, olds[i], part.adv, masks[i], ref_logp=refs[i], **kw, **extras[i])
                if teach is not None:
                    student = logp_all if full_vocab else logp
                    loss, m = distilled.mix(loss, m, student, teach[i], masks[i], kw, first_epoch=(ep == 0))
                part_loss = m["loss"].detach().float()
                loss_sum = part_loss if loss_sum is None else loss_sum + part_loss
                if ep == 0:
                    seen.append((logp.detach(), ent, m))
                    sampled.append(logp.detach())
                # `loss` is this micro-batch's share of the global loss; DeepSpeed divides the summed gradients
                # by the world size, so scale it back up to get the single-process gradient.
                engine.backward(loss * dp.world)
            if ep == 0:
                first = _epoch0_metrics(cfg, dp, plan, seen, refs, olds, inputs, loss_fn, kw, guard_tol,
                                        norm["n_tokens"])
                if teach is not None:
                    first.update(distilled.reduce(dp))
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


class _Distilled:
    """On-policy distillation's share of each micro-batch loss, and its first-epoch metrics summed over the
    micro-batches and ranks (each micro-batch's KL term is its share of the step's, as the policy loss's)."""

    def __init__(self, weight: float, estimator: str):
        self.w, self.estimator = weight, estimator
        self.kl_sum, self.n, self.kl_max, self.loss, self.pg, self.k1_sum = 0.0, 0, -math.inf, 0.0, 0.0, 0.0

    def mix(self, loss: torch.Tensor, m: dict, student: torch.Tensor, teacher: torch.Tensor,
            mask: torch.Tensor, kw: dict, first_epoch: bool) -> tuple[torch.Tensor, dict]:
        """(1 - w) x the GRPO loss + w x the reverse KL of the student's and teacher's log-probs (whole
        distributions or the sampled tokens', by the estimator); m["loss"] becomes the mixed loss."""
        agg = {k: kw[k] for k in ("agg_mode", "norm_len", "num_tokens", "num_seqs")}
        d_loss, d_m = distillation_loss(student, teacher, mask, estimator=self.estimator, **agg)
        # w = 1 or 0: the one term alone, exactly (no 0 x a term that could be non-finite)
        total = d_loss if self.w == 1 else loss if self.w == 0 else (1 - self.w) * loss + self.w * d_loss
        if first_epoch:
            n = int(mask.sum())
            self.n += n
            self.kl_sum += float(d_m["distill/kl_mean"]) * n if n else 0.0
            self.k1_sum += float(d_m["distill/kl_k1_mean"]) * n if n and "distill/kl_k1_mean" in d_m else 0.0
            self.kl_max = max(self.kl_max, float(d_m["distill/kl_max"])) if n else self.kl_max
            self.loss += float(d_loss.detach())
            self.pg += float(m["loss"])
        return total, {**m, "loss": total.detach().float()}

    def reduce(self, dp: DataParallel) -> dict[str, float]:
        """distill/loss, distill/kl_mean, distill/kl_max (and distill/kl_k1_mean with a sampled-token estimator) of the
        step, and `loss` the mixed one (all ranks)."""
        kl_sum, n, loss, pg, k1_sum = dp.sum([self.kl_sum, float(self.n), self.loss, self.pg, self.k1_sum])
        top = dp.max([self.kl_max])[0]
        out = {"distill/loss": loss, "distill/kl_mean": kl_sum / n if n else float("nan"),
               "distill/kl_max": top if n else float("nan"),
               "loss": loss if self.w == 1 else pg if self.w == 0 else (1 - self.w) * pg + self.w * loss}
        if self.estimator != "full":
            out["distill/kl_k1_mean"] = k1_sum / n if n else float("nan")
        return out


def correction_kw(cfg: GRPOConfig) -> dict[str, Any]:
    """`correction_weights`' settings from the config (grpo.tis_mode, tis_cap, tis_min, tis_seq_ratio)."""
    return dict(mode=cfg.tis_mode, c_max=cfg.tis_cap, c_min=cfg.tis_min, seq_ratio=cfg.tis_seq_ratio)


def rejects_tokens(cfg: GRPOConfig) -> bool:
    """Whether the rollout correction rejects tokens (token_mask, sequence_mask)."""
    return cfg.tis_cap is not None and cfg.tis_mode.endswith("_mask")


def _rejecting_pass(policy: Policy, cfg: GRPOConfig, parts: list[TrainInputs]) -> tuple[list, list, list]:
    """Mask modes: the rejected tokens must leave the loss's denominators, which are the whole step's and so
    needed before the first backward. One no-grad forward per micro-batch gives the trainer's log-probs before
    the update (the ratio's old log-probs, as with token_truncate), their weights and the loss masks without
    the rejected tokens. Returns (olds, extras ({"is_weights": w}), masks). Costs one forward per step."""
    olds, extras, masks = [], [], []
    with torch.no_grad():
        for part in parts:
            lp = sequence_logprobs(policy.engine, part.batch, temperature=cfg.logprob_temperature,
                                   chunk_size=cfg.memory.logprob_chunk_size, pack=cfg.memory.pack_sequences)[0]
            w, keep, _ = correction_weights(lp, part.rollout_logp, part.mask, **correction_kw(cfg))
            olds.append(lp)
            extras.append({"is_weights": w})
            masks.append(keep)
    return olds, extras, masks


def _loss_normalisers(dp: DataParallel, masks: list[torch.Tensor]) -> dict[str, float]:
    """num_tokens / num_seqs over the loss masks of every micro-batch and rank: the response tokens the loss
    keeps and the sequences holding at least one of them (a sequence with none, empty or every token rejected,
    is not counted: verl #3915). Each at least 1, so an all-empty step gives loss 0. Collective."""
    tok, seqs = dp.sum([float(sum(int(m.sum()) for m in masks)),
                        float(sum(int((m.sum(dim=-1) > 0).sum()) for m in masks))])
    return {"num_tokens": max(tok, 1.0), "num_seqs": max(seqs, 1.0)}


def measure_drift(cfg: GRPOConfig, step: int) -> bool:
    """Whether step `step` (0-based) measures the beta-0 drift signal: every `drift_every` steps, the first included."""
    return cfg.drift_active() and step % cfg.guards.drift_every == 0


def drift_kl(policy: Policy, cfg: GRPOConfig, parts: list[TrainInputs], sampled: list[torch.Tensor]) -> dict[str, float]:
    """The drift signal without a reference model: per-token k3 KL(pi_before || pi_after) on the step's trained
    completions, pi_before = the trainer's first-epoch log-probs (the weights that sampled them, on-policy) and
    pi_after = one no-grad forward under the updated weights. Token mean and max over every rank (collective)."""
    total, n, peak = 0.0, 0, -math.inf
    with torch.no_grad():
        for part, before in zip(parts, sampled):
            after = sequence_logprobs(policy.engine, part.batch, temperature=cfg.logprob_temperature,
                                      chunk_size=cfg.memory.logprob_chunk_size, pack=cfg.memory.pack_sequences)[0]
            kl = token_kl(before, after, "k3")
            m = part.mask
            total += float(torch.where(m, kl, torch.zeros_like(kl)).sum())
            n += int(m.sum())
            if bool(m.any()):
                peak = max(peak, _masked_max(kl, m))
    s, cnt = policy.dp.sum([total, float(n)])
    mx = policy.dp.max([peak])[0]
    return {"drift/kl_mean": s / cnt if cnt else float("nan"), "drift/kl_max": mx if cnt else float("nan")}


def _epoch0_metrics(cfg: GRPOConfig, dp: DataParallel, plan: list, seen: list, refs: list, olds: list,
                    inputs: TrainInputs, loss_fn: Callable, kw: dict, guard_tol: float, n_tok: int) -> dict[str, float]:
    """The first epoch's metrics, computed as in one pass: the micro-batches' log-probs, entropies and
    reference log-probs are put back into the rank's (B, T) batch and, when the batch was split, `loss_fn`
    is evaluated on it once more (no gradient; (B, T) numbers only), so every metric (means, maxima, clip
    fractions, KL, TIS) is the unsplit one whatever the split. `seen`: (log-probs, entropies, loss_fn's
    metrics) of each micro-batch."""
    logp = _assemble(plan, [lp for lp, _, _ in seen], inputs.rollout_logp)
    ent = _assemble(plan, [e for _, e, _ in seen], inputs.rollout_logp)
    old, extra, tis, loss_mask = inputs.rollout_logp, {}, None, inputs.mask
    if cfg.tis_cap is not None:  # the old log-probs the update used: the trainer's own before the update
        old = _assemble(plan, olds, inputs.rollout_logp)
        w, loss_mask, tis = correction_weights(old, inputs.rollout_logp, inputs.mask, **correction_kw(cfg))
        extra = {"is_weights": w}
    if plan == [None]:  # unsplit: the training call's own metrics, as before micro-batches existed
        m = seen[0][2]
    else:
        with torch.no_grad():
            _, m = loss_fn(logp, old, inputs.adv, loss_mask, ref_logp=_assemble(plan, refs, inputs.rollout_logp),
                           **kw, **extra)
    return _first_epoch_metrics(dp, m, logp, ent, inputs, tis, guard_tol, n_tok)


def _grad_norm(engine, zero_stage: int) -> float | None:
    """Pre-clip global grad norm. Stage 0 keeps grads in .grad (DeepSpeed reports None there);
    stages >= 1 partition them, so DeepSpeed's own norm (after step) is used instead."""
    if zero_stage != 0:
        return None
    norms = [p.grad.detach().float().norm() for p in engine.module.parameters() if p.grad is not None]
    return float(torch.stack(norms).norm()) if norms else 0.0
