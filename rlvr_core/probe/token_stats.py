"""Teacher-forced token statistics between two checkpoints, exact over the full vocabulary.

For every response token y_t of a sequence (prompt + response fed to both models, teacher forcing),
with p_A, p_B the two models' next-token distributions at that position:

    kl_ab     = KL(p_A || p_B) = sum_v p_A(v) (log p_A(v) - log p_B(v))
    kl_ba     = KL(p_B || p_A)
    kl_sym    = (kl_ab + kl_ba) / 2
    entropy_a = -sum_v p_A(v) log p_A(v)         (entropy_b likewise)
    logp_a    = log p_A(y_t)                     (logp_b likewise)
    dlogp     = logp_b - logp_a                  (Δlog p, signed: > 0 where B favours the token)

By convention A is the reference (base model, earlier checkpoint) and B the model under study (the
RL checkpoint), so kl_ba is KL(policy || reference), the direction of the GRPO objective's KL term and
of the seed RL-Probe report (D_KL(RLVR || DPO)).

Why not top-k log-probs: the paper code approximates these sums with each model's top-50 tokens; on a
151k vocabulary that misses the tail where RL moves mass (seed 004: the updates concentrate on
low-probability tokens). Here every sum runs over the whole vocabulary.

Memory: the (tokens x vocabulary) logits are never materialised. The backbone gives the final hidden
states h (N, d) of the response positions only; the head weight W (V, d) is applied one vocabulary
chunk at a time, `h @ W[c0:c1].T`, and each chunk updates running per-token sums with the online
(streaming) log-sum-exp rescaling of Milakov & Gimelshein, "Online normalizer calculation for softmax"
(arXiv 1805.02867). Per token and model we keep the running max m, s = sum e^(a-m),
w = sum e^(a-m) (a-m) and t = sum e^(a-m) (a-b) (a, b: the two models' logits). Then

    lse_A = m_A + log s_A,   entropy_a = log s_A - w_A / s_A,
    kl_ab = t_A / s_A - (lse_A - lse_B),   logp_a = a_y - lse_A.

A chunk never holds more than `budget` elements, so peak memory is set by `vocab_chunk` and `budget`,
not by the response length or the vocabulary size. Models whose head is not a plain linear map of the
last hidden state (logit scaling, adapters) are caught by a one-sequence check against the model's own
logits (`HeadMismatchError`), and `head="logits"` then runs the model's own forward and chunks the
vocabulary of its logits instead (memory grows with batch tokens x vocabulary; `max_batch_tokens`
bounds it).

Exactness: identical checkpoints give bitwise identical logits, so a - b = 0, t = 0 and lse_A = lse_B:
KL and Δlog p are exactly 0. KL and entropy are clamped at 0 (they are >= 0; the clamp only removes
rounding noise). Chunked and unchunked results differ only by float summation order (the tests hold
them to 1e-6 in float32 and 1e-12 in float64).

Masks come from lengths, never from token values (G-pad-mask): sequences are right-padded, the
attention mask is 1 on the first `len(prompt) + len(response)` positions, positions are 0..L-1, and
only the response positions are gathered, so a response that contains the pad id is scored like any
other token.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

__all__ = [
    "ProbeSequence", "TokenStats", "STAT_FIELDS", "HeadMismatchError", "token_stats_from_logits",
    "token_stats_from_hidden", "LinearHead", "linear_head", "teacher_forced_stats", "full_vocab_reference",
]

STAT_FIELDS = ("logp_a", "logp_b", "dlogp", "kl_ab", "kl_ba", "kl_sym", "entropy_a", "entropy_b")
DEFAULT_VOCAB_CHUNK = 8192
DEFAULT_BUDGET = 1 << 22  # elements per chunk temporary (16 MiB in float32)
_NEG = -1e30  # -inf logits are clamped here: exp underflows to exactly 0 and no 0 * inf = nan appears


class HeadMismatchError(RuntimeError):
    """The model's logits are not `lm_head(last_hidden_state)` (+ softcapping): use head="logits"."""


@dataclass(frozen=True)
class ProbeSequence:
    """One teacher-forced sequence. Statistics are computed for each token of `response_ids`.

    sequence_id: unique within a probe (e.g. "synth-test-000017/a_greedy/0").
    problem_id: the problem the response answers; sample_index: which sample of it.
    prompt_ids, response_ids: token ids as the model saw/produced them (prompt tokenized exactly like the
        sampler did, response = the sampled ids when known, else the tokenized response text).
    source: where the response came from ("a_greedy", "b_sampled", "reference", …).
    """

    sequence_id: str
    problem_id: str
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    sample_index: int = 0
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_ids", tuple(int(t) for t in self.prompt_ids))
        object.__setattr__(self, "response_ids", tuple(int(t) for t in self.response_ids))
        if not self.prompt_ids:
            raise ValueError(f"sequence {self.sequence_id!r}: empty prompt (the first response token needs a context)")

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


@dataclass
class TokenStats:
    """Per-token statistics, each a float64 tensor of shape (N,)."""

    logp_a: torch.Tensor
    logp_b: torch.Tensor
    dlogp: torch.Tensor
    kl_ab: torch.Tensor
    kl_ba: torch.Tensor
    kl_sym: torch.Tensor
    entropy_a: torch.Tensor
    entropy_b: torch.Tensor

    @staticmethod
    def cat(parts: Sequence["TokenStats"]) -> "TokenStats":
        if not parts:
            return TokenStats(*(torch.zeros(0, dtype=torch.float64) for _ in STAT_FIELDS))
        return TokenStats(*(torch.cat([getattr(p, f) for p in parts]) for f in STAT_FIELDS))


# ------------------------------------------------------------------------------------ the chunked core
ChunkFn = Callable[[int, int, int, int], tuple[torch.Tensor, torch.Tensor]]


def _accumulate(n: int, vocab: int, chunk_fn: ChunkFn, targets: torch.Tensor, *, vocab_chunk: int, budget: int,
                dtype: torch.dtype) -> TokenStats:
    """Stream over (token block x vocabulary chunk) tiles. chunk_fn(r0, r1, c0, c1) -> (a, b), each (r1-r0, c1-c0)
    logits of models A and B (any float dtype; computed in `dtype`). targets: (n,) token ids."""
    vocab_chunk = max(1, min(vocab_chunk, vocab))
    block = max(1, budget // vocab_chunk)
    out: list[TokenStats] = []
    acc = torch.float64  # running sums: cheap (per token) and keeps the chunk order from mattering
    for r0 in range(0, n, block):
        r1 = min(n, r0 + block)
        y = targets[r0:r1]
        rows = r1 - r0
        dev = y.device
        m_a = torch.full((rows,), -math.inf, dtype=acc, device=dev)
        m_b = m_a.clone()
        s_a, s_b, w_a, w_b, t_a, t_b = (torch.zeros(rows, dtype=acc, device=dev) for _ in range(6))
        ay = torch.zeros(rows, dtype=acc, device=dev)
        by = torch.zeros(rows, dtype=acc, device=dev)
        for c0 in range(0, vocab, vocab_chunk):
            c1 = min(vocab, c0 + vocab_chunk)
            a, b = chunk_fn(r0, r1, c0, c1)
            a = a.to(dtype).clamp(min=_NEG)
            b = b.to(dtype).clamp(min=_NEG)
            ma_new = torch.maximum(m_a, a.amax(-1).to(acc))
            mb_new = torch.maximum(m_b, b.amax(-1).to(acc))
            sc_a, sc_b = torch.exp(m_a - ma_new), torch.exp(m_b - mb_new)  # rescale old sums (0 at the start)
            # The old w is relative to the old max: sum e^(a-m_new)(a-m_new) = e^(m-m_new)(w + s (m - m_new)).
            w_a = sc_a * (w_a + torch.nan_to_num(s_a * (m_a - ma_new)))
            w_b = sc_b * (w_b + torch.nan_to_num(s_b * (m_b - mb_new)))
            s_a, s_b, t_a, t_b = s_a * sc_a, s_b * sc_b, t_a * sc_a, t_b * sc_b
            m_a, m_b = ma_new, mb_new
            za = a - m_a.to(dtype)[:, None]  # (rows, C), <= 0
            zb = b - m_b.to(dtype)[:, None]
            ea, eb = torch.exp(za), torch.exp(zb)
            d = a - b
            s_a += ea.sum(-1).to(acc)
            s_b += eb.sum(-1).to(acc)
            w_a += (ea * za).sum(-1).to(acc)
            w_b += (eb * zb).sum(-1).to(acc)
            t_a += (ea * d).sum(-1).to(acc)
            t_b -= (eb * d).sum(-1).to(acc)
            inside = (y >= c0) & (y < c1)
            if bool(inside.any()):
                idx = (y - c0).clamp(0, c1 - c0 - 1)[:, None]
                ay = torch.where(inside, a.gather(1, idx)[:, 0].to(acc), ay)
                by = torch.where(inside, b.gather(1, idx)[:, 0].to(acc), by)
        log_s_a, log_s_b = torch.log(s_a), torch.log(s_b)
        lse_a, lse_b = m_a + log_s_a, m_b + log_s_b
        lse_diff = (m_a - m_b) + (log_s_a - log_s_b)  # lse_A - lse_B without forming two large numbers
        kl_ab = (t_a / s_a - lse_diff).clamp(min=0.0)
        kl_ba = (t_b / s_b + lse_diff).clamp(min=0.0)
        logp_a, logp_b = ay - lse_a, by - lse_b
        out.append(TokenStats(
            logp_a=logp_a, logp_b=logp_b, dlogp=logp_b - logp_a, kl_ab=kl_ab, kl_ba=kl_ba,
            kl_sym=0.5 * (kl_ab + kl_ba),
            entropy_a=(log_s_a - w_a / s_a).clamp(min=0.0), entropy_b=(log_s_b - w_b / s_b).clamp(min=0.0)))
    return TokenStats.cat(out)


def _check_targets(targets: torch.Tensor, n: int, vocab: int) -> torch.Tensor:
    if targets.shape != (n,):
        raise ValueError(f"targets must have shape ({n},), got {tuple(targets.shape)}")
    if n and (int(targets.min()) < 0 or int(targets.max()) >= vocab):
        raise ValueError(f"target ids must lie in [0, {vocab}), got [{int(targets.min())}, {int(targets.max())}]")
    return targets.long()


def token_stats_from_logits(logits_a: torch.Tensor, logits_b: torch.Tensor, targets: torch.Tensor, *,
                            vocab_chunk: int = DEFAULT_VOCAB_CHUNK, budget: int = DEFAULT_BUDGET,
                            dtype: torch.dtype = torch.float32) -> TokenStats:
    """Statistics from two models' logits. logits_a, logits_b: (N, V); targets: (N,) the actual tokens.

    The vocabulary is processed `vocab_chunk` columns at a time (>= V: one chunk, i.e. unchunked).
    Returns TokenStats of (N,) float64 tensors.
    """
    if logits_a.shape != logits_b.shape or logits_a.dim() != 2:
        raise ValueError(f"logits must both be (N, V), got {tuple(logits_a.shape)} and {tuple(logits_b.shape)}")
    n, vocab = logits_a.shape
    targets = _check_targets(targets, n, vocab)
    return _accumulate(n, vocab, lambda r0, r1, c0, c1: (logits_a[r0:r1, c0:c1], logits_b[r0:r1, c0:c1]), targets,
                       vocab_chunk=vocab_chunk, budget=budget, dtype=dtype)


@dataclass(frozen=True)
class LinearHead:
    """logits = softcap(h @ weight.T + bias); weight (V, d), bias (V,) or None, softcap None or c > 0
    (Gemma-2-style final_logit_softcapping: c * tanh(logits / c))."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None
    softcap: float | None = None

    @property
    def vocab(self) -> int:
        return self.weight.shape[0]

    def logits(self, h: torch.Tensor, c0: int = 0, c1: int | None = None) -> torch.Tensor:
        """(n, d) -> (n, c1 - c0): the head restricted to vocabulary rows c0:c1, in the weight's dtype."""
        w = self.weight[c0:c1]
        out = h.to(w.dtype) @ w.T
        if self.bias is not None:
            out = out + self.bias[c0:c1]
        if self.softcap:
            out = self.softcap * torch.tanh(out / self.softcap)
        return out


def linear_head(model) -> LinearHead:
    """The model's output head (`get_output_embeddings()`, a Linear) plus config softcapping, if any."""
    lin = model.get_output_embeddings()
    if lin is None or not hasattr(lin, "weight"):
        raise HeadMismatchError(f"{type(model).__name__} has no linear output head; use head='logits'")
    cfg = getattr(model, "config", None)
    cap = getattr(cfg, "final_logit_softcapping", None) or None
    return LinearHead(lin.weight.detach(), getattr(lin, "bias", None), float(cap) if cap else None)


def token_stats_from_hidden(h_a: torch.Tensor, head_a: LinearHead, h_b: torch.Tensor, head_b: LinearHead,
                            targets: torch.Tensor, *, vocab_chunk: int = DEFAULT_VOCAB_CHUNK,
                            budget: int = DEFAULT_BUDGET, dtype: torch.dtype = torch.float32) -> TokenStats:
    """Statistics from final hidden states, applying each head one vocabulary chunk at a time.

    h_a: (N, d_a), h_b: (N, d_b) hidden states of the positions that predict `targets` (N,).
    The heads must share the vocabulary size. Never holds more than `budget` logits per model.
    """
    if head_a.vocab != head_b.vocab:
        raise ValueError(f"the two heads have different vocabularies ({head_a.vocab} vs {head_b.vocab} rows): "
                         "token statistics need one shared tokenizer")
    n = h_a.shape[0]
    if h_b.shape[0] != n:
        raise ValueError(f"h_a has {n} rows, h_b {h_b.shape[0]}")
    targets = _check_targets(targets, n, head_a.vocab)
    return _accumulate(n, head_a.vocab,
                       lambda r0, r1, c0, c1: (head_a.logits(h_a[r0:r1], c0, c1), head_b.logits(h_b[r0:r1], c0, c1)),
                       targets, vocab_chunk=vocab_chunk, budget=budget, dtype=dtype)


def full_vocab_reference(logits_a: torch.Tensor, logits_b: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """The textbook computation, materialising everything in float64 (tests and benchmarks' peer)."""
    la = torch.log_softmax(logits_a.double(), -1)
    lb = torch.log_softmax(logits_b.double(), -1)
    pa, pb = la.exp(), lb.exp()

    def wsum(p, x):  # sum p * x with 0 * (+-inf) = 0 (tokens of probability 0)
        return torch.where(p > 0, p * x, torch.zeros_like(p)).sum(-1)

    kl_ab, kl_ba = wsum(pa, la - lb), wsum(pb, lb - la)
    y = targets.long()[:, None]
    logp_a, logp_b = la.gather(1, y)[:, 0], lb.gather(1, y)[:, 0]
    return {"logp_a": logp_a, "logp_b": logp_b, "dlogp": logp_b - logp_a, "kl_ab": kl_ab, "kl_ba": kl_ba,
            "kl_sym": 0.5 * (kl_ab + kl_ba), "entropy_a": -wsum(pa, la), "entropy_b": -wsum(pb, lb)}


# ------------------------------------------------------------------------------ teacher-forced batches
def _batches(seqs: Sequence[ProbeSequence], max_batch_tokens: int) -> Iterable[list[int]]:
    """Indices grouped into right-padded batches of at most max_batch_tokens (padded) tokens, longest first."""
    order = sorted(range(len(seqs)), key=lambda i: -seqs[i].length)
    batch: list[int] = []
    for i in order:
        width = seqs[batch[0]].length if batch else seqs[i].length
        if batch and (len(batch) + 1) * width > max_batch_tokens:
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def _encode_batch(seqs: list[ProbeSequence], pad_id: int, device) -> tuple[torch.Tensor, ...]:
    """input_ids, attention_mask, position_ids (B, L) right-padded from lengths; the flat (B, L) indices of
    the positions that predict each response token; and the response tokens (N,)."""
    L = max(s.length for s in seqs)
    B = len(seqs)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    mask = torch.zeros((B, L), dtype=torch.long)
    pred_rows, pred_cols, targets = [], [], []
    for b, s in enumerate(seqs):
        full = s.prompt_ids + s.response_ids
        ids[b, : len(full)] = torch.tensor(full, dtype=torch.long)
        mask[b, : len(full)] = 1  # from the length, never from token values (G-pad-mask)
        p, r = len(s.prompt_ids), len(s.response_ids)
        pred_rows += [b] * r
        pred_cols += range(p - 1, p + r - 1)  # position t predicts token t + 1
        targets += s.response_ids
    pos = torch.arange(L, dtype=torch.long).expand(B, L)
    return (ids.to(device), mask.to(device), pos.to(device), torch.tensor(pred_rows, dtype=torch.long, device=device),
            torch.tensor(pred_cols, dtype=torch.long, device=device), torch.tensor(targets, dtype=torch.long, device=device))


def _model_device(model) -> torch.device:
    return next(model.parameters()).device


def _backbone(model):
    get = getattr(model, "get_decoder", None)
    dec = get() if callable(get) else None
    return dec if dec is not None else model.base_model


_CHECK_TOKENS = 16
_HEAD_CHECKED: "weakref.WeakSet" = weakref.WeakSet()  # models whose head already matched their own logits


class _Scorer:
    """One model's per-batch output for the positions that predict response tokens.

    head="hidden": final hidden states (N, d) from the backbone, the head applied later chunk by chunk.
    head="logits": the model's own logits at those positions (N, V).
    """

    def __init__(self, model, head: Literal["hidden", "logits"]):
        self.model = model
        self.mode = head
        self.head = linear_head(model) if head == "hidden" else None
        self.checked = head != "hidden" or model in _HEAD_CHECKED

    def __call__(self, ids, mask, pos, rows, cols) -> torch.Tensor:
        if self.mode == "logits":
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)
            return out.logits[rows, cols]
        h = _backbone(self.model)(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).last_hidden_state
        if not self.checked:
            self._check(ids[:1], mask[:1], pos[:1], h[0])
        return h[rows, cols]

    def _check(self, ids, mask, pos, h0) -> None:
        """The chunked head must reproduce the model's own logits (once per model object, on one position of
        the first sequence: causal attention makes the first 16 tokens' forward enough)."""
        last = min(int(mask[0].sum()), _CHECK_TOKENS) - 1
        own = self.model(input_ids=ids[:, : last + 1], attention_mask=mask[:, : last + 1],
                         position_ids=pos[:, : last + 1], use_cache=False, logits_to_keep=1).logits[0, -1].float()
        ours = self.head.logits(h0[last : last + 1])[0].float()
        if own.shape != ours.shape or not torch.allclose(own, ours, rtol=1e-3, atol=1e-3 * max(1.0, float(own.abs().max()))):
            err = float((own - ours).abs().max()) if own.shape == ours.shape else float("nan")
            raise HeadMismatchError(
                f"{type(self.model).__name__}: lm_head(last_hidden_state) differs from the model's logits "
                f"(max |diff| {err:.3g}); the head has extra scaling or adapters: use head='logits'")
        self.checked = True
        _HEAD_CHECKED.add(self.model)


@torch.inference_mode()
def teacher_forced_stats(reference, checkpoints: Mapping[str, Any], sequences: Sequence[ProbeSequence], *,
                         pad_token_id: int = 0, head: Literal["hidden", "logits"] = "hidden",
                         vocab_chunk: int = DEFAULT_VOCAB_CHUNK, budget: int = DEFAULT_BUDGET,
                         max_batch_tokens: int = 8192, dtype: torch.dtype = torch.float32,
                         progress: Callable[[int, int], None] | None = None) -> dict[str, list[TokenStats]]:
    """Token statistics of every checkpoint against `reference` (A) on the same teacher-forced sequences.

    reference, checkpoints: causal LMs sharing one tokenizer, in eval mode (checkpoints: name -> model;
        the reference's forward runs once per batch whatever the number of checkpoints).
    sequences: the responses to score; pad_token_id only fills padded slots (its value never matters).
    Returns {checkpoint name: [TokenStats (len(response),) per sequence, in input order]}.
    """
    if not checkpoints:
        raise ValueError("teacher_forced_stats needs at least one checkpoint besides the reference")
    if len({s.sequence_id for s in sequences}) != len(sequences):
        raise ValueError("sequence ids must be unique (they key every per-sequence table)")
    device = _model_device(reference)
    ref = _Scorer(reference, head)
    others = {name: _Scorer(m, head) for name, m in checkpoints.items()}
    results: dict[str, list[TokenStats | None]] = {name: [None] * len(sequences) for name in checkpoints}
    done = 0
    scored = [i for i, s in enumerate(sequences) if s.response_ids]
    for name in checkpoints:
        for i, s in enumerate(sequences):
            if not s.response_ids:
                results[name][i] = TokenStats.cat([])
    for batch in _batches([sequences[i] for i in scored], max_batch_tokens):
        idx = [scored[j] for j in batch]
        seqs = [sequences[i] for i in idx]
        ids, mask, pos, rows, cols, targets = _encode_batch(seqs, pad_token_id, device)
        out_a = ref(ids, mask, pos, rows, cols)
        for name, sc in others.items():
            out_b = sc(ids.to(_model_device(sc.model)), mask.to(_model_device(sc.model)),
                       pos.to(_model_device(sc.model)), rows, cols).to(device)
            kw = dict(vocab_chunk=vocab_chunk, budget=budget, dtype=dtype)
            if head == "hidden":
                st = token_stats_from_hidden(out_a, ref.head, out_b, _moved(sc.head, device), targets, **kw)
            else:
                st = token_stats_from_logits(out_a, out_b, targets, **kw)
            start = 0
            for i, s in zip(idx, seqs):
                r = len(s.response_ids)
                results[name][i] = TokenStats(*(getattr(st, f)[start : start + r].cpu() for f in STAT_FIELDS))
                start += r
        done += len(batch)
        if progress is not None:
            progress(done, len(scored))
    return {name: list(v) for name, v in results.items()}  # type: ignore[arg-type]


def _moved(head: LinearHead, device) -> LinearHead:
    if head.weight.device == torch.device(device):
        return head
    return LinearHead(head.weight.to(device), None if head.bias is None else head.bias.to(device), head.softcap)
