"""The `hf` engine's graphed decode step (issue 41, part 2): a static KV cache and one compiled forward per
token, for CUDA graphs (`torch.compile(mode="reduce-overhead")`).

Why: at B = 512 a decode step of a 0.5B model launches a few hundred small kernels; on a GPU their launch cost,
not the arithmetic, sets the step time. A CUDA graph replays the whole forward as one launch, but needs every
shape and address fixed, so this path differs from the eager loop (`HFEngine._decode_batch`) in three ways:
  * the KV cache is a transformers `StaticCache` of length Lb + T (Lb: the batch's longest prompt rounded up
    to a multiple of PROMPT_BUCKET, so a few lengths cover every batch), kept for the newest shape and reset;
  * finished rows stay in the batch (their tokens are computed and ignored) instead of leaving it, and a short
    last batch is filled with dummy rows to `batch_size`, so the step always has the same shape;
  * the attention mask covers the whole cache from the start (the prompt's padding 0, everything after 1; the
    cache position masks the future), so it is one tensor per batch.
The sampling, stop-string automaton, buffers and bookkeeping are the eager loop's (same methods). Results are
the eager loop's up to float summation order (the batch keeps its rows and the attention spans the padded
cache): greedy tokens equal, log-probs within 1e-5 (tests/sampling/test_hf_decode_loop.py, on CPU with
torch.compile's `eager` backend, which traces the same graph without generating kernels).
"""

from __future__ import annotations

import numpy as np
import torch

from rlvr_core.sampling.base import SamplingParams

__all__ = ["decode_batch_static", "PROMPT_BUCKET"]

PROMPT_BUCKET = 64


def _cache(engine, B: int, length: int):
    """The engine's static cache for B rows of `length` positions, reset (created on first use)."""
    from transformers import StaticCache

    key = (B, length)
    cache = engine._static_caches.get(key)
    if cache is None:  # only the newest shape is kept: at B = 512 a 0.5B model's cache is several GB
        engine._static_caches.clear()
        cache = engine._static_caches[key] = StaticCache(config=engine.model.config, max_cache_len=length)
    else:
        cache.reset()
    return cache


def _step_fn(engine):
    """The compiled decode step: one token per row in, (B, V) float32 logits of it out."""
    if engine._compiled_step is None:
        model = engine.model

        def step(input_ids, attention_mask, position_ids, cache_position, cache):
            out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                        past_key_values=cache, cache_position=cache_position, use_cache=True)
            return out.logits[:, -1, :].float()

        mode = "reduce-overhead" if engine.compile_backend == "inductor" else None
        engine._compiled_step = torch.compile(step, backend=engine.compile_backend, mode=mode, fullgraph=True,
                                              dynamic=False)
    return engine._compiled_step


def decode_batch_static(engine, rows: list, params: SamplingParams) -> None:
    """`HFEngine._decode_batch` with a static cache and the compiled step (see the module docstring)."""
    from rlvr_core.sampling.hf import _Buffers, _Row, _Scratch, left_padded

    dev, n, T = engine.device, len(rows), params.max_new_tokens
    B = max(engine.batch_size, n)
    padded = rows + [_Row(-1, -1, rows[0].seed, rows[0].prompt_tokens) for _ in range(B - n)]   # dummies
    uniforms = None if params.greedy else engine._uniforms(padded, T).to(dev)
    longest = max(len(r.prompt_tokens) for r in rows)
    Lb = -(-longest // PROMPT_BUCKET) * PROMPT_BUCKET
    input_ids, attention_mask, position_ids = left_padded(padded, engine.pad_token_id, dev, length=Lb)
    mask = attention_mask.new_ones((B, Lb + T))
    mask[:, :Lb] = attention_mask
    cache = _cache(engine, B, Lb + T)
    out = engine.model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, past_key_values=cache,
                       cache_position=torch.arange(Lb, device=dev), use_cache=True, **engine._prefill_kwargs)
    logits = out.logits[:, -1, :].float()
    out = None
    stops = engine._automaton(params.stop, logits.shape[-1])
    buf, scratch = _Buffers(B, T, dev), _Scratch(B, logits.shape[-1], params.greedy, dev)
    state = torch.zeros(B, dtype=torch.long, device=dev)
    next_pos, cache_pos = position_ids[:, -1:] + 1, torch.tensor([Lb], device=dev)
    active = np.arange(n)                                       # real rows still decoding; dummies never are
    step = _step_fn(engine)
    for t in range(T):
        tokens, token_lp = engine._pick(logits, params, uniforms, t, scratch)
        logits = None                                           # a graph's output: consumed before the next replay
        buf.tokens[:, t].copy_(tokens)
        buf.logprobs[:, t].copy_(token_lp)
        code = stops.code[state, tokens]
        if stops.n_states > 1:
            state = code >> 2
        flags = (code & 3).cpu().numpy()                        # the step's one device->host copy
        done = engine._finish(padded, active, flags[active], buf, t, params, stops)
        active = active[~done]
        if len(active) == 0:
            break
        if dev.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()
        logits = step(tokens[:, None], mask, next_pos, cache_pos, cache)
        next_pos, cache_pos = next_pos + 1, cache_pos + 1
    buf.to_rows(padded)
