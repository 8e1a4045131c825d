"""`hf` engine: batched sampling with transformers on CPU or GPU, written as an explicit decode loop.

Why a loop of our own instead of `model.generate`: two things the project depends on are awkward to get
exactly from `generate`:
  * seeds per request (G-fixed-seed). Each row of a batch draws its random numbers from its own CPU
    `torch.Generator` seeded with `request_seed(run_seed, prompt_id, step, sample_index)`, so a sample
    depends only on its own seed, never on which other requests shared its batch or on batch_size.
  * raw log-probs (G-logprob-temp). We keep log_softmax(logits) at temperature 1 for the sampled token,
    next to the processed distribution (temperature, top-k, top-p) that the token was drawn from.

The loop, for one batch of B requests, with no per-row work on the host (issue 41):
  1. prefill: prompts left-padded to length L; attention_mask (B, L) is built from the prompt lengths,
     never from token values (G-pad-mask: a prompt may contain the pad id), and position_ids
     (B, L) = cumsum(mask) - 1, so a padded row sees exactly the positions it would see alone.
     Each row's max_new_tokens uniforms are drawn now, one generator call per row, and copied to the
     device once: a CPU generator draws serially, so the row's t-th uniform is the one it drew when it drew
     one per token (CPU samples are bit-identical to the loop before issue 41; on CUDA the draws used to
     come from CUDA generators, so CUDA samples changed once, docs/engines.md).
  2. each step: logits (B, V) of the last position -> raw log-probs (B, V); choose a token per row
     (argmax when temperature == 0, else inverse-CDF sampling at the row's uniform for this step on the
     processed distribution); token and raw log-prob go into preallocated (B, max_new_tokens) device buffers.
  3. a row finishes on an eos id, on a stop string, or at max_new_tokens. Eos and stop strings are one
     table lookup per row on the device (`rlvr_core.sampling.stops`: an automaton over the stop strings'
     bytes, advanced by whole tokens); the step's flags come to the host in its one device->host copy, and
     only a flagged row gets host work: a flagged stop string is confirmed by decoding the row's tail, the
     old check, so cut points and finish reasons are the old ones. Finished rows leave the batch and its KV
     cache at the same steps as before (same shapes, so the same logits bit for bit on CPU).
  4. feed the chosen tokens (B', 1) with the cache; the mask is a growing view of a preallocated one.
  The buffers come to the host once per batch.

Lockstep (`lockstep=`, for a model whose forward is a collective, e.g. a ZeRO-3 partitioned policy whose
hooks all-gather each layer's weights): every rank must run the same number of forward calls, in the same
order. `lockstep(n)` returns the maximum of n over the ranks. Each `generate` call then runs the largest
number of decode batches any rank has (a rank with fewer, or none, runs dummy batches), and each batch
decodes until no row on ANY rank is active (one all-reduce per token step); a rank whose rows are all done
keeps calling the model on a dummy one-token input. Sampled tokens do not change: a row's draws come from
its own generator, and dummy forwards draw nothing.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from rlvr_core.core.seeding import request_seed
from rlvr_core.sampling.base import Sample, SamplingParams, check_prompt_ids, find_stop
from rlvr_core.sampling.stops import StopAutomaton, token_bytes

__all__ = ["HFEngine", "process_logits"]


def process_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Sampling distribution's logits: (B, V) float -> (B, V), removed tokens set to -inf.

    temperature > 0 divides; top_k > 0 keeps the k largest; top_p < 1 keeps the smallest set of most
    likely tokens whose probability mass reaches top_p (always at least one token).
    """
    x = logits / temperature if temperature != 1.0 else logits   # dividing by 1 is exact: skip the copy
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
    generator: torch.Generator | None = None   # the row-by-row loops of subclasses (rlvr_core.probe.decoding)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None


class _Buffers:
    """One decode batch's results on the device, indexed by batch row: tokens (B, T), raw log-probs (B, T),
    and on the host each row's length (set when it finishes)."""

    def __init__(self, B: int, T: int, device):
        self.tokens = torch.empty((B, T), dtype=torch.long, device=device)
        self.logprobs = torch.empty((B, T), dtype=torch.float32, device=device)
        self.lengths = np.zeros(B, dtype=np.int64)

    def to_rows(self, rows: list["_Row"]) -> None:
        """Copy to the host once and hand each row its tokens and log-probs (Python ints and floats)."""
        tokens, logprobs = self.tokens.cpu().numpy(), self.logprobs.cpu().numpy()
        for b, r in enumerate(rows):
            n = int(self.lengths[b])
            r.tokens, r.logprobs = tokens[b, :n].tolist(), logprobs[b, :n].tolist()


@dataclass
class _Active:
    """The rows still decoding, in batch order, and their per-row device state (dropped together)."""

    index: np.ndarray                # host: batch index of each active row
    index_dev: torch.Tensor          # the same, on the device
    mask: torch.Tensor               # (B', L + T) attention mask: the prompt's, then ones; L + t + 1 used at step t
    next_pos: torch.Tensor           # (B', 1) position of the next token
    state: torch.Tensor              # (B',) stop automaton state
    uniforms: torch.Tensor | None    # (B', T) float64, None when greedy

    def keep(self, keep: np.ndarray) -> torch.Tensor:
        """Keep the rows at positions `keep` (of the active ones); returns them as a device index."""
        idx = torch.from_numpy(keep).to(self.mask.device)
        self.index = self.index[keep]
        self.index_dev, self.mask, self.next_pos, self.state = (
            x[idx] for x in (self.index_dev, self.mask, self.next_pos, self.state))
        self.uniforms = None if self.uniforms is None else self.uniforms[idx]
        return idx


class _Scratch:
    """Work space of the vocabulary-wide math of one decode batch, (B, V) each, used as [:B'] views (rows
    leave the batch): raw log-probs (float32) and, when sampling, probabilities (float32) and their cumulative
    sum (float64). Allocated once per batch instead of once per step (on a CPU, freeing and faulting in
    ~0.3-0.6 GB per step at B = 512 with a 151,936-token vocabulary cost more than the bookkeeping)."""

    def __init__(self, B: int, V: int, greedy: bool, device):
        self.logprobs = torch.empty((B, V), dtype=torch.float32, device=device)
        self.probs = None if greedy else torch.empty((B, V), dtype=torch.float32, device=device)
        self.cdf = None if greedy else torch.empty((B, V), dtype=torch.float64, device=device)


def left_padded(rows: list["_Row"], pad_token_id: int, device,
                length: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, position_ids) of the rows' prompts, left-padded to the longest one (or to
    `length`), on `device`. The mask comes from the prompt lengths, never from token values (G-pad-mask: a pad
    id may also be a real token)."""
    lengths = [len(r.prompt_tokens) for r in rows]
    B, L = len(rows), max(max(lengths), length or 0)
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
    compile: the graphed decode step (`decode_batch_static` below: static KV cache, finished rows kept,
        `torch.compile(mode="reduce-overhead")`, i.e. CUDA graphs). None (default): on for CUDA without
        lockstep, off elsewhere (on a CPU the eager loop, which drops finished rows, is faster).
    compile_backend: torch.compile backend for it ("inductor"; "eager" traces without generating kernels: tests).
    """

    name = "hf"

    def __init__(self, model, tokenizer, *, batch_size: int = 64, device: str = "cpu",
                 add_special_tokens: bool = True, eos_token_ids: list[int] | None = None,
                 pad_token_id: int | None = None, lockstep: Callable[[int], int] | None = None,
                 compile: bool | None = None, compile_backend: str = "inductor"):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.device = torch.device(device)
        self.lockstep = lockstep
        # The graphed step (`decode_batch_static`) pays where kernel launches dominate a step: CUDA.
        # Under lockstep the ranks' forwards are collectives of a partitioned module: never compiled.
        self.compile = (self.device.type == "cuda" and lockstep is None) if compile is None else bool(compile)
        if self.compile and lockstep is not None:
            raise ValueError("compile=True cannot be combined with lockstep (a partitioned, collective forward)")
        self.compile_backend = compile_backend
        self._compiled_step = None
        self._static_caches: dict = {}
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
        self._automata: dict[tuple, StopAutomaton] = {}           # per (stop strings, vocab size)
        self._token_bytes: dict[int, list[bytes] | None] = {}     # per vocab size

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
        return self.generate_ids(encoded, prompt_ids, params, step=step, epoch=epoch,
                                 first_sample_index=first_sample_index)

    def generate_ids(self, prompt_token_ids: list[list[int]], prompt_ids: list[str], params: SamplingParams, *,
                     step: int = 0, epoch: int = 0, first_sample_index: int = 0) -> list[list[Sample]]:
        """`generate` on prompts given as token ids (token-in/token-out: a multi-turn rollout's context is never
        decoded and re-encoded). Each sample's `prompt_token_ids` are the ids it was conditioned on."""
        check_prompt_ids(prompt_token_ids, prompt_ids)
        encoded = [list(map(int, ids)) for ids in prompt_token_ids]
        for pid, ids in zip(prompt_ids, encoded):
            if len(ids) == 0:
                raise ValueError(f"prompt {pid!r} encodes to zero tokens")
        rows = [
            _Row(i, s, request_seed(params.seed, prompt_ids[i], step, s, epoch=epoch), list(encoded[i]))
            for i in range(len(encoded)) for s in range(first_sample_index, first_sample_index + params.n)
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

        out: list[list[Sample]] = [[] for _ in encoded]
        for row in rows:
            out[row.prompt_index].append(self._to_sample(row, prompt_ids[row.prompt_index], params))
        return out

    # ---- the decode loop ---------------------------------------------------------------------------

    def _decode_batch(self, rows: list[_Row], params: SamplingParams) -> None:
        """Decode `rows` to the end (see the module docstring), gradients off (the caller's). Under lockstep
        `rows` may be empty (a dummy batch) and the loop runs until no row on any rank is active."""
        if not rows:
            self._dummy_forward()
            return self._dummy_steps(0, params.max_new_tokens)
        if self.compile:
            return decode_batch_static(self, rows, params)
        dev, B, T = self.device, len(rows), params.max_new_tokens
        uniforms = None if params.greedy else self._uniforms(rows, T).to(dev)   # (B, T) float64
        input_ids, attention_mask, position_ids = left_padded(rows, self.pad_token_id, dev)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=True, **self._prefill_kwargs)
        past, logits = out.past_key_values, out.logits[:, -1, :].float()   # logits (B, V)
        stops = self._automaton(params.stop, logits.shape[-1])
        L = input_ids.shape[1]
        mask = attention_mask.new_ones((B, L + T))
        mask[:, :L] = attention_mask
        act = _Active(np.arange(B), torch.arange(B, device=dev), mask, position_ids[:, -1:] + 1,
                      torch.zeros(B, dtype=torch.long, device=dev), uniforms)
        buf, scratch = _Buffers(B, T, dev), _Scratch(B, logits.shape[-1], params.greedy, dev)
        for t in range(T):
            tokens, token_lp = self._pick(logits, params, act.uniforms, t, scratch)   # (B',) each
            out = logits = None     # release the step's logits before the next forward allocates its own
            buf.tokens[:, t].index_copy_(0, act.index_dev, tokens)
            buf.logprobs[:, t].index_copy_(0, act.index_dev, token_lp)
            code = stops.code[act.state, tokens]                    # 4 * next state + 2 * stop? + eos?
            if stops.n_states > 1:
                act.state = code >> 2
            flags = (code & 3).cpu().numpy()                        # the step's one device->host copy
            keep = np.flatnonzero(~self._finish(rows, act.index, flags, buf, t, params, stops))
            if (len(keep) if self.lockstep is None else self.lockstep(len(keep))) == 0:
                break                                               # no row active here (lockstep: anywhere)
            if len(keep) == 0:                                      # lockstep: done here, not elsewhere
                self._dummy_forward()
                self._dummy_steps(t + 1, T)
                break
            if len(keep) < len(act.index):                          # drop finished rows everywhere
                idx = act.keep(keep)
                past.batch_select_indices(idx)
                tokens = tokens[idx]
            out = self.model(input_ids=tokens[:, None], attention_mask=act.mask[:, :L + t + 1],
                             position_ids=act.next_pos, past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits[:, -1, :].float()
            act.next_pos = act.next_pos + 1
        buf.to_rows(rows)

    def _dummy_forward(self) -> None:
        """One forward call on a one-token input, output unused: under lockstep it joins the collectives of
        the other ranks' forward call."""
        one = torch.full((1, 1), self.pad_token_id, dtype=torch.long, device=self.device)
        self.model(input_ids=one, attention_mask=torch.ones_like(one), position_ids=torch.zeros_like(one),
                   use_cache=False)

    def _dummy_steps(self, t0: int, T: int) -> None:
        """Lockstep, no row active here: a dummy forward per token step until no rank has an active row."""
        for _ in range(t0, T):
            if self.lockstep(0) == 0:
                return
            self._dummy_forward()

    @staticmethod
    def _uniforms(rows: list[_Row], T: int) -> torch.Tensor:
        """(B, T) float64: the T uniforms each row may need, drawn at once from a CPU generator seeded with
        the row's seed. One call of n draws gives the same numbers as n calls of one (CPU generators draw
        serially), so a row's t-th token uses exactly the uniform it used when drawn one per step."""
        out = torch.empty((len(rows), T), dtype=torch.float64)
        for b, r in enumerate(rows):
            g = torch.Generator()
            g.manual_seed(r.seed)
            out[b] = torch.rand(T, generator=g, dtype=torch.float64)
        return out

    @staticmethod
    def _pick(logits: torch.Tensor, params: SamplingParams, uniforms: torch.Tensor | None, t: int,
              scratch: "_Scratch") -> tuple[torch.Tensor, torch.Tensor]:
        """(token (B',), its raw temperature-1 log-prob (B',)) per row: argmax when greedy, else inverse CDF
        of the processed distribution at the row's t-th uniform. The (B', V) intermediates go into `scratch`
        (the same values as fresh tensors: same kernels; no vocabulary-sized allocation per step)."""
        n = logits.shape[0]
        raw_logprobs = torch.log_softmax(logits, dim=-1, out=scratch.logprobs[:n])   # (B', V), temperature 1
        if params.greedy:
            tokens = logits.argmax(dim=-1)
        else:
            x = process_logits(logits, params.temperature, params.top_k, params.top_p)
            probs = torch.softmax(x, dim=-1, out=scratch.probs[:n])
            cdf = torch.cumsum(probs, dim=-1, dtype=torch.float64, out=scratch.cdf[:n])   # (B', V), float64
            # first index whose cdf exceeds u * total: never a zero-probability token
            idx = torch.searchsorted(cdf, (uniforms[:, t] * cdf[:, -1])[:, None], right=True)[:, 0]
            tokens = idx.clamp(max=logits.shape[-1] - 1)
        return tokens, raw_logprobs.gather(-1, tokens[:, None])[:, 0]

    # ---- stop strings -------------------------------------------------------------------------------

    def _finish(self, rows: list[_Row], active: np.ndarray, flags: np.ndarray, buf: "_Buffers", t: int,
                params: SamplingParams, stops: StopAutomaton) -> np.ndarray:
        """Which active rows end with token t (bool per active row); sets their finish reason and length.
        Host work only for flagged rows (eos, or a stop string the automaton saw end in this token), each
        flagged stop confirmed by the exact decode-based check of the old loop."""
        done = np.zeros(len(active), dtype=bool)
        flagged = np.flatnonzero(flags)
        candidates = flagged[(flags[flagged] & 1) == 0]             # stop string, not eos
        window = self._stop_window(params.stop)
        tails = buf.tokens[torch.from_numpy(active[candidates]).to(buf.tokens.device),
                           max(0, t + 1 - window):t + 1].tolist() if len(candidates) else []
        confirmed = {int(b) for b, tail in zip(candidates, tails) if self._tail_has_stop(tail, params.stop, window)}
        for b in flagged:
            if flags[b] & 1 or int(b) in confirmed:
                rows[active[b]].finish_reason = "stop"
                done[b] = True
        if t + 1 == params.max_new_tokens:
            for b in np.flatnonzero(~done):
                rows[active[b]].finish_reason = "length"
            done[:] = True
        buf.lengths[active[done]] = t + 1
        return done

    def _automaton(self, stop: tuple[str, ...], vocab_size: int) -> StopAutomaton:
        """The stop/eos automaton of these stop strings (cached per engine). Where the byte table does not
        apply (not a byte-level tokenizer, or a stop string holding U+FFFD, which invalid bytes also decode
        to), every token of every row is a candidate: the old per-row check, every step."""
        key = (stop, vocab_size)
        if key not in self._automata:
            if vocab_size not in self._token_bytes:
                self._token_bytes[vocab_size] = token_bytes(self.tokenizer, vocab_size) if stop else None
            table = self._token_bytes[vocab_size]
            exact = not stop or (table is not None and not any("\ufffd" in s for s in stop))
            self._automata[key] = (StopAutomaton(table if stop else [b""] * vocab_size, stop,
                                                 self.eos_token_ids, self.device) if exact else
                                   StopAutomaton.always(vocab_size, self.eos_token_ids, self.device))
        return self._automata[key]

    @staticmethod
    def _stop_window(stop: tuple[str, ...]) -> int:
        # Every token decodes to >= 1 byte and a character is <= 4 bytes, so the last 4*len(s) + 4 tokens
        # cover any stop string s that the newest token completed (+4 for a character split at the edge).
        return 4 * max((len(s) for s in stop), default=0) + 4

    def _decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def _append(self, r: _Row, tok: int, logprob: float, params: SamplingParams, stop_window: int) -> bool:
        """Row-by-row bookkeeping for subclasses that decode a row at a time on the host (the probe's guided
        engine): add a drawn token to row `r`; True (with its finish reason set) when the row is done."""
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


# ---- the graphed decode step -------------------------------------------------------------------------
# The `hf` engine's graphed decode step (issue 41, part 2): a static KV cache and one compiled forward per
# token, for CUDA graphs (`torch.compile(mode="reduce-overhead")`).
#
# Why: at B = 512 a decode step of a 0.5B model launches a few hundred small kernels; on a GPU their launch cost,
# not the arithmetic, sets the step time. A CUDA graph replays the whole forward as one launch, but needs every
# shape and address fixed, so this path differs from the eager loop (`HFEngine._decode_batch`) in three ways:
#   * the KV cache is a transformers `StaticCache` of length Lb + T (Lb: the batch's longest prompt rounded up
#     to a multiple of PROMPT_BUCKET, so a few lengths cover every batch), kept for the newest shape and reset;
#   * finished rows stay in the batch (their tokens are computed and ignored) instead of leaving it, and a short
#     last batch is filled with dummy rows to `batch_size`, so the step always has the same shape;
#   * the attention mask covers the whole cache from the start (the prompt's padding 0, everything after 1; the
#     cache position masks the future), so it is one tensor per batch.
# The sampling, stop-string automaton, buffers and bookkeeping are the eager loop's (same methods). Results are
# the eager loop's up to float summation order (the batch keeps its rows and the attention spans the padded
# cache): greedy tokens equal, log-probs within 1e-5 (tests/sampling/test_hf_decode_loop.py, on CPU with
# torch.compile's `eager` backend, which traces the same graph without generating kernels).

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
