"""The `hf` engine's decode loop as it was before issue 41 (commit 2478857), kept unchanged as the reference
that the current loop must reproduce bit for bit on CPU (tests/sampling/test_hf_decode_loop.py) and as the
"before" arm of benchmarks/bench_decode.py (`--impl reference`). Per row and token it draws one uniform from
the row's generator and decodes the row's tail to look for stop strings. Not used by the package."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable

import torch

from rlvr_core.core.seeding import request_seed
from rlvr_core.sampling.base import Sample, SamplingParams, check_prompt_ids, find_stop

__all__ = ["HFEngine", "process_logits"]


def process_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Sampling distribution's logits: (B, V) float -> (B, V), removed tokens set to -inf.

    temperature > 0 divides; top_k > 0 keeps the k largest; top_p < 1 keeps the smallest set of most
    likely tokens whose probability mass reaches top_p (always at least one token).
    """
    x = logits / temperature
    if top_k > 0 and top_k < x.shape[-1]:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        probs = torch.softmax(sorted_x, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs  # mass of strictly more likely tokens
        drop_sorted = mass_before >= top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return x


@dataclass
class _Row:
    """Bookkeeping for one request while it decodes."""

    prompt_index: int
    sample_index: int
    seed: int
    prompt_tokens: list[int]
    generator: torch.Generator | None = None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None


def left_padded(rows: list["_Row"], pad_token_id: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, position_ids) of the rows' prompts, left-padded to the longest one, on
    `device`. The mask comes from the prompt lengths, never from token values (G-pad-mask: a pad id may
    also be a real token)."""
    lengths = [len(r.prompt_tokens) for r in rows]
    B, L = len(rows), max(lengths)
    input_ids = torch.full((B, L), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((B, L), dtype=torch.long)
    for b, r in enumerate(rows):
        input_ids[b, L - lengths[b]:] = torch.tensor(r.prompt_tokens, dtype=torch.long)
        attention_mask[b, L - lengths[b]:] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids.to(device), attention_mask.to(device), position_ids.to(device)


class HFEngine:
    """Sampling engine on a transformers causal LM.

    model: a `PreTrainedModel` with a causal-LM head (moved to `device`, put in eval mode).
    tokenizer: its tokenizer; prompts are encoded with `add_special_tokens` (default True: BOS for models
        that use one). Render chat prompts with their template first (see `rlvr_core.data.templates`) and pass
        add_special_tokens=False so the BOS is not doubled.
    batch_size: requests (prompt x sample) decoded together.
    eos_token_ids: ids that end a sample; default: the model's generation_config eos ids plus the
        tokenizer's eos id.
    pad_token_id: filler for the left-padded slots only (masked out by length); default the tokenizer's
        pad id, else its eos id, else 0. Its value never affects results.
    lockstep: for a model whose forward is a collective (see the module docstring): n -> max of n over
        ranks. None (default): no collectives. The model is then left where it is (not moved).
    """

    name = "hf"

    def __init__(self, model, tokenizer, *, batch_size: int = 64, device: str = "cpu",
                 add_special_tokens: bool = True, eos_token_ids: list[int] | None = None,
                 pad_token_id: int | None = None, lockstep: Callable[[int], int] | None = None):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.device = torch.device(device)
        self.lockstep = lockstep
        # A partitioned (ZeRO-3) module already lives on its device; .to() would touch its empty partitions.
        self.model = (model if lockstep is not None else model.to(self.device)).eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.add_special_tokens = add_special_tokens
        if eos_token_ids is None:
            eos: set[int] = set()
            gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
            for e in ([gen_eos] if isinstance(gen_eos, int) else list(gen_eos or [])):
                eos.add(int(e))
            if tokenizer.eos_token_id is not None:
                eos.add(int(tokenizer.eos_token_id))
            eos_token_ids = sorted(eos)
        self.eos_token_ids = frozenset(int(e) for e in eos_token_ids)
        if pad_token_id is None:
            pad_token_id = tokenizer.pad_token_id
        if pad_token_id is None:
            pad_token_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
        self.pad_token_id = int(pad_token_id)
        self._prefill_kwargs = {}
        if "logits_to_keep" in inspect.signature(model.forward).parameters:
            self._prefill_kwargs["logits_to_keep"] = 1  # only the last position's logits are needed

    @classmethod
    def from_pretrained(cls, path: str, *, dtype: str | torch.dtype = "auto", **kwargs) -> "HFEngine":
        """Load model and tokenizer from a local folder or hub id (tokenizer padding side is irrelevant)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        return cls(model, tokenizer, **kwargs)

    # ---- public API -------------------------------------------------------------------------------

    def generate(self, prompts: list[str], prompt_ids: list[str], params: SamplingParams, *,
                 step: int = 0, epoch: int = 0, first_sample_index: int = 0) -> list[list[Sample]]:
        """Per prompt (input order), params.n samples ordered by sample_index, which runs from
        `first_sample_index` (so a prompt sampled in chunks gets the samples one larger call would). See
        `Sample` for fields."""
        check_prompt_ids(prompts, prompt_ids)
        encoded = [self.tokenizer(p, add_special_tokens=self.add_special_tokens)["input_ids"] for p in prompts]
        for pid, ids in zip(prompt_ids, encoded):
            if len(ids) == 0:
                raise ValueError(f"prompt {pid!r} encodes to zero tokens")
        rows = [
            _Row(i, s, request_seed(params.seed, prompt_ids[i], step, s, epoch=epoch), list(encoded[i]))
            for i in range(len(prompts)) for s in range(first_sample_index, first_sample_index + params.n)
        ]
        # Rows of similar length share a batch (less padding); results do not depend on the grouping.
        order = sorted(range(len(rows)), key=lambda r: -len(rows[r].prompt_tokens))
        n_batches = -(-len(order) // self.batch_size)
        if self.lockstep is not None:  # every rank decodes as many batches as the busiest (empty ones: dummies)
            n_batches = self.lockstep(n_batches)
        # inference_mode is the fastest; a ZeRO-3 module's gathered weights must stay ordinary tensors for the
        # training that follows, so under lockstep only gradients are switched off.
        with torch.no_grad() if self.lockstep is not None else torch.inference_mode():
            for start in range(0, n_batches * self.batch_size, self.batch_size):
                self._decode_batch([rows[r] for r in order[start:start + self.batch_size]], params)

        out: list[list[Sample]] = [[] for _ in prompts]
        for row in rows:
            out[row.prompt_index].append(self._to_sample(row, prompt_ids[row.prompt_index], params))
        return out

    # ---- the decode loop ---------------------------------------------------------------------------

    def _decode_batch(self, rows: list[_Row], params: SamplingParams) -> None:
        """Decode `rows` to the end (see the module docstring), gradients off (the caller's). Under lockstep
        `rows` may be empty (a dummy batch) and the loop runs until no row on any rank is active."""
        dev = self.device
        if not params.greedy:
            for r in rows:
                r.generator = torch.Generator(device=dev)
                r.generator.manual_seed(r.seed)
        if rows:
            input_ids, attention_mask, position_ids = left_padded(rows, self.pad_token_id, dev)
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             use_cache=True, **self._prefill_kwargs)
            past = out.past_key_values
            logits = out.logits[:, -1, :].float()                   # (B, V)
            next_pos = position_ids[:, -1:] + 1                     # (B, 1)
        else:
            self._dummy_forward()
        active = list(rows)                                         # rows still decoding, batch order
        stop_window = self._stop_window(params.stop)

        for t in range(params.max_new_tokens):
            keep: list[int] = []
            if active:
                raw_logprobs = torch.log_softmax(logits, dim=-1)    # (B', V), temperature 1
                tokens = self._choose(logits, params, active)       # (B',)
                token_lp = raw_logprobs.gather(-1, tokens[:, None])[:, 0].tolist()
                for b, (r, tok, lp) in enumerate(zip(active, tokens.tolist(), token_lp)):
                    if not self._append(r, tok, lp, params, stop_window):
                        keep.append(b)
            if (len(keep) if self.lockstep is None else self.lockstep(len(keep))) == 0:
                return                                              # no row active here (lockstep: anywhere)
            if not keep:                                            # lockstep: done here, not elsewhere
                active = []
                self._dummy_forward()
                continue
            if len(keep) < len(active):                             # drop finished rows everywhere
                idx = torch.tensor(keep, device=dev)
                past.batch_select_indices(idx)
                attention_mask, next_pos, tokens = attention_mask[idx], next_pos[idx], tokens[idx]
                active = [active[b] for b in keep]
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(active), 1))], dim=-1)
            out = self.model(input_ids=tokens[:, None], attention_mask=attention_mask, position_ids=next_pos,
                             past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[:, -1, :].float()
            next_pos = next_pos + 1

    def _dummy_forward(self) -> None:
        """One forward call on a one-token input, output unused: under lockstep it joins the collectives of
        the other ranks' forward call."""
        one = torch.full((1, 1), self.pad_token_id, dtype=torch.long, device=self.device)
        self.model(input_ids=one, attention_mask=torch.ones_like(one), position_ids=torch.zeros_like(one),
                   use_cache=False)

    def _choose(self, logits: torch.Tensor, params: SamplingParams, active: list[_Row]) -> torch.Tensor:
        """Token per row, (B', V) -> (B',): argmax when greedy, else inverse CDF with the row's generator."""
        if params.greedy:
            return logits.argmax(dim=-1)
        probs = torch.softmax(process_logits(logits, params.temperature, params.top_k, params.top_p), dim=-1)
        cdf = probs.double().cumsum(dim=-1)                         # (B', V), float64
        u = torch.stack([torch.rand((), generator=r.generator, device=logits.device, dtype=torch.float64)
                         for r in active])                          # (B',) one uniform per row
        # first index whose cdf exceeds u * total: never a zero-probability token
        idx = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0]
        return idx.clamp(max=logits.shape[-1] - 1)

    # ---- stop strings -------------------------------------------------------------------------------

    @staticmethod
    def _stop_window(stop: tuple[str, ...]) -> int:
        # Every token decodes to >= 1 byte and a character is <= 4 bytes, so the last 4*len(s) + 4 tokens
        # cover any stop string s that the newest token completed (+4 for a character split at the edge).
        return 4 * max((len(s) for s in stop), default=0) + 4

    def _decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def _append(self, r: _Row, tok: int, logprob: float, params: SamplingParams, stop_window: int) -> bool:
        """Add a drawn token to row `r`; True (with its finish reason set) when the row is done."""
        r.tokens.append(tok)
        r.logprobs.append(logprob)
        if tok in self.eos_token_ids or (params.stop and self._tail_has_stop(r.tokens, params.stop, stop_window)):
            r.finish_reason = "stop"
        elif len(r.tokens) >= params.max_new_tokens:
            r.finish_reason = "length"
        return r.finish_reason is not None

    def _tail_has_stop(self, tokens: list[int], stop: tuple[str, ...], window: int) -> bool:
        # Stop strings completed earlier were caught at an earlier step, so only the tail can hold a new one.
        return find_stop(self._decode(tokens[-window:]), stop) >= 0

    def _to_sample(self, row: _Row, prompt_id: str, params: SamplingParams) -> Sample:
        text = self._decode(row.tokens)
        cut = find_stop(text, params.stop)
        if cut >= 0:
            text = text[:cut]
        return Sample(prompt_id=prompt_id, sample_index=row.sample_index, text=text, token_ids=row.tokens,
                      finish_reason=row.finish_reason, logprobs=row.logprobs, seed=row.seed,
                      prompt_token_ids=list(row.prompt_tokens))
