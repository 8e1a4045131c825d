"""Splitting a rank's trained completions into micro-batches for gradient accumulation.

`plan_micro_batches` decides which rows go together: by `micro_batch_size` (rows per micro-batch) and/or
`max_tokens_per_micro_batch` (rows x the longest prompt+completion length, i.e. the padded tokens the
forward actually processes). Rows are sorted by length, longest first, and packed greedily, so rows of
similar length share a micro-batch and little padding is run; a row longer than the budget goes alone.
With neither limit the rank's batch is one micro-batch in its own order (the trainer's behaviour before
micro-batches existed, tensors untouched).

`take_rows` cuts a `TrainInputs` (update.py) down to some rows and re-pads every tensor to those rows'
own longest prompt+completion and completion: the memory of a forward/backward then follows the
micro-batch, not the batch. Right padding is causal-safe (no real token attends to the padding after it),
so a row's log-probs do not depend on what it is batched with, up to float summation order.

`empty_like` is the micro-batch of a rank that has run out of rows while another rank has not (a token
budget gives ranks different counts): one position, mask all False, advantage 0. Its loss is 0 and every
gradient exactly 0, but it runs the forward and backward, and so the collectives ZeRO issues in them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

__all__ = ["plan_micro_batches", "take_rows", "empty_like"]


def plan_micro_batches(seq_lens: list[int], *, micro_batch_size: int | None,
                       max_tokens: int | None) -> list[list[int]]:
    """Row indices of each micro-batch, for rows of prompt+completion lengths `seq_lens` (module docstring)."""
    n = len(seq_lens)
    if not micro_batch_size and not max_tokens:
        return [list(range(n))]
    order = sorted(range(n), key=lambda i: -seq_lens[i])  # stable: equal lengths keep their order
    plan: list[list[int]] = []
    cur: list[int] = []
    width = 0  # the current micro-batch's longest row (its first: rows come longest first)
    for i in order:
        full = micro_batch_size is not None and len(cur) >= micro_batch_size
        over = max_tokens is not None and (len(cur) + 1) * max(width, seq_lens[i]) > max_tokens
        if cur and (full or over):
            plan.append(cur)
            cur, width = [], 0
        cur.append(i)
        width = max(width, seq_lens[i])
    if cur:
        plan.append(cur)
    return plan


def take_rows(inputs: Any, rows: list[int]) -> Any:
    """`inputs` (a TrainInputs) restricted to `rows`, every tensor re-padded to those rows' own widths."""
    b = inputs.batch
    idx = torch.tensor(rows, dtype=torch.long, device=b["input_ids"].device)
    am = b["attention_mask"].index_select(0, idx)
    S = max(int(am.sum(1).max()), 1)
    lengths = b["lengths"].index_select(0, idx)
    T = max(int(lengths.max()), 1)
    batch = {"input_ids": b["input_ids"].index_select(0, idx)[:, :S], "attention_mask": am[:, :S],
             "position_ids": b["position_ids"].index_select(0, idx)[:, :S],
             "gather": b["gather"].index_select(0, idx)[:, :T].clamp(max=S - 1),
             "targets": b["targets"].index_select(0, idx)[:, :T], "lengths": lengths}
    adv = inputs.adv.index_select(0, idx)
    return dataclasses.replace(inputs, batch=batch, adv=adv[:, :T] if adv.dim() == 2 else adv,
                               rollout_logp=inputs.rollout_logp.index_select(0, idx)[:, :T],
                               mask=inputs.mask.index_select(0, idx)[:, :T])


def empty_like(inputs: Any) -> Any:
    """A one-position micro-batch with no response token (loss 0, zero gradient); module docstring."""
    b = inputs.batch
    dev = b["input_ids"].device
    zeros = torch.zeros((1, 1), dtype=torch.long, device=dev)
    batch = {"input_ids": b["input_ids"][:1, :1].clone(), "attention_mask": torch.ones_like(zeros),
             "position_ids": zeros, "gather": zeros.clone(), "targets": b["targets"][:1, :1].clone(),
             "lengths": torch.zeros(1, dtype=torch.long, device=dev)}
    return dataclasses.replace(inputs, batch=batch, adv=torch.zeros_like(inputs.adv[:1, :1] if inputs.adv.dim() == 2
                                                                         else inputs.adv[:1]),
                               rollout_logp=torch.zeros_like(inputs.rollout_logp[:1, :1]),
                               mask=torch.zeros((1, 1), dtype=torch.bool, device=dev))
