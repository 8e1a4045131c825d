"""Teacher-forced log-probs of the sampled tokens (and the entropy of each next-token distribution).

Two paths, the same numbers (tests/grpo/test_micro_batches.py: float32 within 1e-6, gradients included):

  * full (`chunk_size` 0, the reference): the model's logits at every position, (B, S, V) in the model's
    dtype, a float32 copy, the (B, T, V) response rows gathered from it, log_softmax. Peak memory grows
    with B x S x V: a 0.5B model with Qwen's 151936-token vocabulary runs out of an 80 GB GPU at 512
    sequences of 512 tokens on the logits alone.
  * chunked (`chunk_size` > 0): the model runs as usual but its output head is swapped, for that one call,
    for a function that takes the final hidden states, keeps only the N response positions that are real
    tokens (the prompt's and the padding's hidden states are never projected), and projects them in
    chunks of `chunk_size` rows: logits = head(h_chunk).float(), log_softmax, the target's log-prob and
    (detached) the entropy. Each chunk runs under `torch.utils.checkpoint` (non-reentrant), so its
    (chunk, V) logits are freed after the forward and recomputed, one chunk at a time, in the backward:
    the extra memory is O(chunk x V) whatever the batch. The entropy is taken in the forward only, never in
    the recomputation. The result is the head's output, so a DeepSpeed
    engine's forward wraps it as it wraps logits (its backward hooks fire before any gradient, as before).

The swap is of the head module's `forward` (an instance attribute, removed afterwards): the module itself
is still called, so ZeRO-3's gather/release hooks run around it, a LoRA-wrapped head computes its adapted
output, and a tied head (Qwen2's lm_head = embed_tokens) needs nothing special. It assumes logits =
head(final hidden state): models that post-process logits (Gemma-2's soft-capping, Cohere's logit_scale)
are refused with a message; they need `logprob_chunk_size: 0`.

`temperature` divides the logits before log_softmax in both paths (it exists to plant G-logprob-temp).
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

from rlvr_core.grpo.losses import mask_from_lengths

__all__ = ["sequence_logprobs", "full_vocab_logprobs", "output_head"]


def sequence_logprobs(model, batch: dict, *, temperature: float = 1.0, with_entropy: bool = False,
                      chunk_size: int = 0, pack: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(completion token t | prefix) for every (b, t), (B, T) float32, padding holds garbage.

    `model`: a Hugging Face causal LM, a peft PeftModel or a DeepSpeed engine around either. `batch`:
    `update.build_batch`'s tensors. `temperature` must be 1 for on-policy RL with an engine that returns
    raw log-probs; it is a parameter only so tests can plant the G-logprob-temp bug. Entropy (B, T) of the
    full next-token distribution is returned when asked (detached, it is a metric). `chunk_size`: 0 = the
    full-vocabulary path, else response positions per chunk of the chunked path (module docstring). `pack`
    (chunked path only): the sequences packed into fewer rows, several per row (`_packed`).
    """
    if not chunk_size:
        return _full_vocab_logprobs(model, batch, temperature, with_entropy)
    B, T = batch["targets"].shape
    S = batch["input_ids"].shape[1]
    rows, cols = mask_from_lengths(batch["lengths"], T).nonzero(as_tuple=True)
    empty = rows.numel() == 0
    if empty:
        # No response token (an empty micro-batch): project one padding slot anyway, so the head and every
        # weight stay in the graph and receive a (zero) gradient, as on the ranks that have tokens.
        rows = cols = torch.zeros(1, dtype=torch.long, device=batch["targets"].device)
    targets = batch["targets"][rows, cols]
    if pack and not empty:
        inputs, offsets = _packed(batch)
        positions = offsets[rows] + batch["gather"][rows, cols]  # rows of the packed (N, H) hidden states
    else:
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")}
        positions = rows * S + batch["gather"][rows, cols]       # rows of the flattened (B*S, H) hidden states
    with _response_head(output_head(model), positions, targets, chunk_size, temperature, with_entropy) as side:
        out = model(**inputs, use_cache=False)
    flat = out.logits                                             # (N,): what the swapped head returned
    logp = torch.zeros((B, T), dtype=flat.dtype, device=flat.device).index_put((rows, cols), flat)
    ent = None
    if with_entropy:
        ent = torch.zeros((B, T), dtype=flat.dtype, device=flat.device).index_put((rows, cols), side["entropy"])
    return logp, ent


def _packed(batch: dict) -> tuple[dict, torch.Tensor]:
    """The batch's sequences (right-padded rows) packed into as few rows of the same width as fit them, and
    where each starts in the flattened packed rows.

    Rows of width W = the longest sequence, filled first-fit, longest first; position ids restart at 0 at every
    sequence (and at a row's leftover tail, which becomes a sequence of its own), no attention mask:
    transformers then finds the sequences from the position ids and masks each off from the others
    (masking_utils.find_packed_sequence_indices), so a token sees exactly what it sees in its padded row. With
    R <= B rows of the same width, the tokens computed (R x W) and a dense attention's cost (R x W^2) never
    exceed the padded batch's (B x W, B x W^2). Returns the inputs and offsets (B,): each sequence's first token
    in the flattened (R x W) rows."""
    real = batch["attention_mask"].bool()
    lens = real.sum(1).tolist()
    W = max(lens)
    used: list[int] = []                                   # tokens placed in each packed row
    start = [0] * len(lens)
    for b in sorted(range(len(lens)), key=lambda i: -lens[i]):
        r = next((r for r, u in enumerate(used) if u + lens[b] <= W), None)
        if r is None:
            r = len(used)
            used.append(0)
        start[b], used[r] = r * W + used[r], used[r] + lens[b]
    ids = torch.zeros(len(used) * W, dtype=batch["input_ids"].dtype, device=real.device)
    pos = torch.zeros(len(used) * W, dtype=torch.long, device=real.device)
    for b, n in enumerate(lens):
        ids[start[b]:start[b] + n] = batch["input_ids"][b, :n]
        pos[start[b]:start[b] + n] = torch.arange(n, device=real.device)
    for r, u in enumerate(used):                           # a row's tail: a padding "sequence" of its own
        pos[r * W + u:(r + 1) * W] = torch.arange(W - u, device=real.device)
    offsets = torch.tensor(start, dtype=torch.long, device=real.device)
    return {"input_ids": ids.view(-1, W), "position_ids": pos.view(-1, W), "attention_mask": None}, offsets


def _full_vocab_logprobs(model, batch: dict, temperature: float,
                         with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    logp, ent, _ = full_vocab_logprobs(model, batch, temperature=temperature, with_entropy=with_entropy)
    return logp, ent


def full_vocab_logprobs(model, batch: dict, *, temperature: float = 1.0, with_entropy: bool = False
                        ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """The full path, keeping the whole (B, T, V) float32 log-softmax at the response positions (with
    gradient): (sampled tokens' log-probs (B, T), entropy (B, T) or None, log-softmax (B, T, V)). On-policy
    distillation needs the whole distribution (distillation.py); padding rows hold garbage."""
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
    return logp, ent, logp_all


# Config attributes of models whose logits are not head(hidden state); the chunked path would skip that step.
_LOGIT_POSTPROCESSING = ("final_logit_softcapping", "logit_scale", "output_multiplier_scale", "logits_scaling")


def output_head(model) -> torch.nn.Module:
    """The module that maps final hidden states to logits (lm_head), through a DeepSpeed engine and peft."""
    inner = model.module if isinstance(getattr(model, "module", None), torch.nn.Module) else model
    head = inner.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(inner).__name__} has no output head (get_output_embeddings() is None); "
                         "set grpo.memory.logprob_chunk_size: 0")
    cfg = getattr(inner, "config", None)
    post = [a for a in _LOGIT_POSTPROCESSING if getattr(cfg, a, None) not in (None, 1, 1.0)]
    if post:
        raise ValueError(f"{type(inner).__name__} post-processes its logits ({', '.join(post)}), which the "
                         "chunked log-prob path does not reproduce; set grpo.memory.logprob_chunk_size: 0")
    return head


def _entropy(logp_all: torch.Tensor) -> torch.Tensor:
    """Entropy of each row of (n, V) log-probs, (n,), no gradient (a metric)."""
    with torch.no_grad():
        return -(logp_all.exp() * logp_all).sum(-1)


def _chunk_logprobs(project: Callable, h: torch.Tensor, targets: torch.Tensor, temperature: float,
                    entropy_due: list[bool]) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk: (n, H) hidden states -> the targets' log-probs (n,) and the entropies (n,), float32.
    The same operations as the full path, on n rows. The entropy is computed while `entropy_due[0]`, which
    the first call clears: the backward's recomputation of the chunk (checkpoint) skips it, as it has no
    gradient and was already taken (issue 41: it cost a vocabulary-wide exp, product and sum per chunk)."""
    logits = project(h).float()
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, targets[:, None])[:, 0]
    if not entropy_due[0]:
        return logp, logp.new_zeros(())
    entropy_due[0] = False
    return logp, _entropy(logp_all)


@contextlib.contextmanager
def _response_head(head: torch.nn.Module, positions: torch.Tensor, targets: torch.Tensor, chunk_size: int,
                   temperature: float, with_entropy: bool):
    """For the duration of the block, `head(hidden)` returns the (N,) log-probs of `targets` at the flat
    `positions` of hidden (B, S, H); the entropies go to the yielded dict's "entropy"."""
    own = head.__dict__.get("forward")          # an instance-level forward someone installed (accelerate hooks)
    project = own if own is not None else type(head).forward.__get__(head)
    side: dict[str, torch.Tensor | None] = {"entropy": None}

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        h = hidden.reshape(-1, hidden.shape[-1]).index_select(0, positions)
        recompute = torch.is_grad_enabled() and h.requires_grad
        parts = []
        for s in range(0, h.shape[0], chunk_size):
            args = (project, h[s:s + chunk_size], targets[s:s + chunk_size], temperature, [with_entropy])
            parts.append(checkpoint(_chunk_logprobs, *args, use_reentrant=False) if recompute
                         else _chunk_logprobs(*args))
        if with_entropy:
            side["entropy"] = torch.cat([e for _, e in parts])
        return torch.cat([lp for lp, _ in parts])

    head.forward = forward
    try:
        yield side
    finally:
        if own is None:
            del head.forward
        else:
            head.forward = own
