"""Data parallelism for the GRPO trainer: which prompts a rank owns, and how per-rank numbers become the step's.

Every rank runs the same loop on a contiguous slice of the step's P prompts (whole groups: advantages
compare completions of one prompt, so a group is never split). Three things make N ranks equal one
process that holds the whole batch (docs/grpo_training.md, "Multi-process and multi-node"):

  * rollouts: per-request seeds are functions of (seed, prompt id, epoch, step, sample index) only, so a
    prompt sampled on rank 1 draws exactly what it draws in a single process;
  * gradient: DeepSpeed *averages* gradients over ranks. Each rank's loss is therefore normalised by the
    global token / sequence count (`global_normalisers`) and multiplied by the world size before
    backward; the average of the ranks' gradients is then the single-process gradient, in every
    `loss_agg` mode (each mode is a sum over sequences divided by a batch-wide constant);
  * metrics: sums and extremes are all-reduced and per-sample values gathered in rank order (= curriculum
    order), so rank 0's step row is the single-process row up to float summation order.
  * decisions: anything that changes control flow (DAPO dynamic sampling's rounds and kept groups) is
    decided from gathered per-group numbers, identically on every rank, so every rank issues the same
    collectives. A rank may then train fewer groups than another (or none: it runs a zero-loss forward
    and backward so the gradient collectives still match); the global normalisers keep the sum exact.

With one process every method returns its input and no collective is issued, so the single-process
trainer computes exactly what it computed before data parallelism existed. Control flow must be the
same on every rank: each collective here is called by all ranks in the same order.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

__all__ = ["DataParallel", "check_divisible", "launch_world_size", "global_normalisers", "reduce_loss_metrics",
           "shutdown"]


def launch_world_size() -> int:
    """World size before DeepSpeed initialises: what the launcher (torchrun, deepspeed) exported."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def check_divisible(prompts_per_step: int, world: int) -> None:
    """Each rank takes P / world whole prompts; refuse anything else before any work is done."""
    if prompts_per_step % world:
        raise ValueError(
            f"prompts_per_step={prompts_per_step} is not divisible by the world size {world}: each of the "
            f"{world} ranks takes an equal contiguous share of the step's prompts (whole groups). Use a "
            f"multiple of {world} (e.g. {world * max(1, round(prompts_per_step / world))}) or another process count.")


@dataclass(frozen=True)
class DataParallel:
    rank: int
    world: int
    device: torch.device  # where collective buffers live (nccl needs them on the rank's GPU)

    @classmethod
    def current(cls, device: torch.device | str = "cpu") -> "DataParallel":
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size(), torch.device(device))
        return cls(0, 1, torch.device(device))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, n: int) -> slice:
        """This rank's contiguous share of n items (n divisible by the world size, see check_divisible)."""
        k = n // self.world
        return slice(self.rank * k, (self.rank + 1) * k)

    def _reduce(self, values: list[float], op) -> list[float]:
        if self.world == 1:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t, op=op)
        return t.tolist()

    def sum(self, values: list[float]) -> list[float]:
        return self._reduce(values, torch.distributed.ReduceOp.SUM)

    def max(self, values: list[float]) -> list[float]:
        return self._reduce(values, torch.distributed.ReduceOp.MAX)

    def gather(self, t: torch.Tensor) -> torch.Tensor:
        """Equal-shaped per-rank tensors concatenated along dim 0 in rank order, on every rank."""
        if self.world == 1:
            return t
        parts = [torch.empty_like(t, device=self.device) for _ in range(self.world)]
        torch.distributed.all_gather(parts, t.to(self.device).contiguous())
        return torch.cat(parts).to(t.device)

    def gather_objects(self, items: list) -> list:
        """Per-rank lists of picklable objects concatenated in rank order, on every rank (small payloads
        only: the trainer sends the few rollout rows it logs per step, never whole batches)."""
        if self.world == 1:
            return list(items)
        parts: list = [None] * self.world
        torch.distributed.all_gather_object(parts, list(items))
        return [x for part in parts for x in part]

    def barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()


def global_normalisers(dp: DataParallel, n_tokens_local: int, n_seqs_global: int) -> dict[str, float]:
    """`num_tokens` / `num_seqs` for `grpo_loss`: the whole step's counts, so each rank's loss is its share
    of the global loss (the ranks' losses add up to it). Returns also the global token count."""
    n_tok = int(dp.sum([float(n_tokens_local)])[0])
    # clamp like token-mean's own mask.sum().clamp(min=1): an all-empty batch gives loss 0, not nan
    return {"num_tokens": max(n_tok, 1), "num_seqs": n_seqs_global, "n_tokens": n_tok}


# grpo_loss metrics by how they combine: shares of a globally normalised loss add up; extremes take the
# extreme; everything else is a mean over the rank's response tokens and is re-weighted by token counts.
_SUMMED = frozenset({"loss", "pg_loss", "kl_loss"})
_MAXED = frozenset({"ratio_max", "kl_ref_max", "logprob_mismatch/max_abs"})
_MINNED = frozenset({"ratio_min"})


def reduce_loss_metrics(dp: DataParallel, metrics: dict[str, float], n_local: int, n_global: int) -> dict[str, float]:
    """The step's metrics from each rank's (`grpo_loss` metrics plus any other token means).

    A rank with no response tokens reports nan means and extremes; it contributes nothing here.
    """
    if dp.world == 1:
        return dict(metrics)
    keys = sorted(metrics)  # same order on every rank
    summed = [k for k in keys if k not in _MAXED and k not in _MINNED]
    extreme = [k for k in keys if k in _MAXED or k in _MINNED]
    sums = dp.sum([metrics[k] if k in _SUMMED else (metrics[k] * n_local if n_local else 0.0) for k in summed])
    # min(x) = -max(-x): one collective for both kinds of extreme
    ext = dp.max([(metrics[k] if k in _MAXED else -metrics[k]) if n_local else -math.inf for k in extreme])
    out = {k: (s if k in _SUMMED else (s / n_global if n_global else math.nan)) for k, s in zip(summed, sums)}
    for k, v in zip(extreme, ext):
        out[k] = math.nan if not n_global else (v if k in _MAXED else -v)
    return out


def shutdown() -> None:
    """End of a launched script: every rank waits for the others, then leaves the process group.

    Without this, ZeRO-3 with 2 processes once aborted at interpreter exit (STACK.md).
    """
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
