"""Exactness of the teacher-forced token statistics (issue 9 bars).

* identical checkpoints give KL = 0 and Δlog p = 0 exactly;
* a hand-built pair of real Qwen2 models with known logits matches closed forms;
* chunked-vocabulary results equal unchunked ones and a float64 textbook computation.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlvr_core.probe.inputs import sequences_from_rows
from rlvr_core.probe.token_stats import (STAT_FIELDS, HeadMismatchError, ProbeSequence, full_vocab_reference,
                                         linear_head, teacher_forced_stats, token_stats_from_hidden,
                                         token_stats_from_logits)


def _flat(results, name):
    return {f: torch.cat([getattr(s, f) for s in results[name]]) for f in STAT_FIELDS}


# ------------------------------------------------------------------------------------------ identical
def test_identical_checkpoints_give_exact_zeros(model_a, tokenizer, rows):
    seqs = sequences_from_rows(rows["test"][:12], tokenizer, "qa")
    twin = copy.deepcopy(model_a)
    for chunk in (7, 1000):
        res = teacher_forced_stats(model_a, {"same": model_a, "twin": twin}, seqs, vocab_chunk=chunk)
        for name in ("same", "twin"):
            st = _flat(res, name)
            assert st["kl_ab"].numel() == sum(len(s.response_ids) for s in seqs)
            assert torch.all(st["kl_ab"] == 0) and torch.all(st["kl_ba"] == 0) and torch.all(st["kl_sym"] == 0)
            assert torch.all(st["dlogp"] == 0)
            assert torch.equal(st["logp_a"], st["logp_b"]) and torch.equal(st["entropy_a"], st["entropy_b"])
            assert torch.all(st["logp_a"] < 0) and torch.all(st["entropy_a"] > 0)


# ------------------------------------------------------------------------------------- closed form
V, D = 48, 64  # vocabulary, hidden size (a perfect square: sqrt(D) = 8 makes the scaling exact)


def bigram_qwen2(table: torch.Tensor, dtype=torch.float32) -> Qwen2ForCausalLM:
    """A real Qwen2ForCausalLM whose logits at position t are exactly table[x_t] (a bigram model).

    Every attention and MLP output projection is zero, so the residual stream is the token embedding;
    embedding 8 * e_x has RMS 1, the final RMSNorm weight 1/8 makes h = e_x, and lm_head = table.T.
    """
    cfg = Qwen2Config(vocab_size=V, hidden_size=D, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, rms_norm_eps=1e-30, tie_word_embeddings=False,
                      max_position_embeddings=128)
    m = Qwen2ForCausalLM(cfg).to(dtype).eval()
    with torch.no_grad():
        for layer in m.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb = torch.zeros(V, D, dtype=dtype)
        emb[torch.arange(V), torch.arange(V)] = 8.0
        m.model.embed_tokens.weight.copy_(emb)
        m.model.norm.weight.fill_(0.125)
        w = torch.zeros(V, D, dtype=dtype)
        w[:, :V] = table.T.to(dtype)
        m.lm_head.weight.copy_(w)
    return m


def _closed_form(prev: int, y: int) -> dict[str, float]:
    """A uniform (all logits 0); B: logit c at token j, 0 elsewhere, with c, j functions of the previous token."""
    c, j = _c(prev), _j(prev)
    z = math.exp(c) + V - 1
    logp_b = (c if y == j else 0.0) - math.log(z)
    h_b = math.log(z) - c * math.exp(c) / z
    kl_ab = -math.log(V) + math.log(z) - c / V
    kl_ba = math.log(V) - h_b
    return {"logp_a": -math.log(V), "logp_b": logp_b, "dlogp": logp_b + math.log(V), "kl_ab": kl_ab, "kl_ba": kl_ba,
            "kl_sym": 0.5 * (kl_ab + kl_ba), "entropy_a": math.log(V), "entropy_b": h_b}


def _c(x: int) -> float:
    return 0.5 + (x % 7) * 1.25  # 0.5 .. 8.0


def _j(x: int) -> int:
    return (3 * x + 1) % V


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.float64, 1e-12)])
def test_hand_built_models_match_closed_form(dtype, tol):
    table_b = torch.zeros(V, V, dtype=torch.float64)
    for x in range(V):
        table_b[x, _j(x)] = _c(x)
    a = bigram_qwen2(torch.zeros(V, V), dtype)
    b = bigram_qwen2(table_b, dtype)
    g = torch.Generator().manual_seed(0)
    seqs = []
    for i in range(6):  # responses of different lengths, including the pad id 1 inside a response (G-pad-mask)
        prompt = torch.randint(0, V, (3 + i,), generator=g).tolist()
        resp = torch.randint(0, V, (5 + 3 * i,), generator=g).tolist()
        resp[2] = 1
        seqs.append(ProbeSequence(f"s{i}", f"p{i}", prompt, resp))
    for chunk in (5, V):
        res = teacher_forced_stats(a, {"b": b}, seqs, pad_token_id=1, vocab_chunk=chunk, dtype=dtype)
        for s, st in zip(seqs, res["b"]):
            full = s.prompt_ids + s.response_ids
            for k in range(len(s.response_ids)):
                pos = len(s.prompt_ids) + k
                want = _closed_form(full[pos - 1], full[pos])
                for f in STAT_FIELDS:
                    assert getattr(st, f)[k].item() == pytest.approx(want[f], abs=tol, rel=tol), (f, s.sequence_id, k)


# ------------------------------------------------------------------------------- chunked vs unchunked
def test_chunked_equals_unchunked_and_float64_reference():
    g = torch.Generator().manual_seed(0)
    n, vocab = 53, 1031
    la = 4 * torch.randn(n, vocab, generator=g)
    lb = la + torch.randn(n, vocab, generator=g)
    la[3, 100:200] = float("-inf")  # masked vocabulary entries are handled (p = 0, no nan)
    lb[3, 100:200] = float("-inf")
    y = torch.randint(0, vocab, (n,), generator=g)
    y[3] = 5
    ref = full_vocab_reference(la.double(), lb.double(), y)
    one = token_stats_from_logits(la, lb, y, vocab_chunk=vocab)
    for chunk, budget in ((vocab, 1 << 22), (128, 128 * 8), (1, 7), (500, 10**9)):
        st = token_stats_from_logits(la, lb, y, vocab_chunk=chunk, budget=budget)
        st64 = token_stats_from_logits(la.double(), lb.double(), y, vocab_chunk=chunk, budget=budget, dtype=torch.float64)
        for f in STAT_FIELDS:
            assert torch.isfinite(getattr(st, f)).all()
            torch.testing.assert_close(getattr(st, f), getattr(one, f), atol=1e-6, rtol=1e-6)
            torch.testing.assert_close(getattr(st, f), ref[f], atol=2e-6, rtol=1e-5)
            torch.testing.assert_close(getattr(st64, f), ref[f], atol=1e-12, rtol=1e-12)


def test_hidden_path_equals_model_logits(model_a, model_b, tokenizer, rows):
    seqs = sequences_from_rows(rows["test"][:10], tokenizer, "qa")
    hid = teacher_forced_stats(model_a, {"b": model_b}, seqs, head="hidden", vocab_chunk=64, max_batch_tokens=300)
    log = teacher_forced_stats(model_a, {"b": model_b}, seqs, head="logits", vocab_chunk=10_000)
    ha, hb = _flat(hid, "b"), _flat(log, "b")
    assert ha["kl_ba"].mean() > 1e-3  # the two models really differ
    for f in STAT_FIELDS:
        torch.testing.assert_close(ha[f], hb[f], atol=2e-5, rtol=1e-4)
    # and the logits path agrees with the float64 textbook computation on the models' own logits
    s = seqs[0]
    ids = torch.tensor([s.prompt_ids + s.response_ids])
    with torch.no_grad():
        la = model_a(ids).logits[0, len(s.prompt_ids) - 1:-1]
        lb = model_b(ids).logits[0, len(s.prompt_ids) - 1:-1]
    ref = full_vocab_reference(la, lb, torch.tensor(s.response_ids))
    for f in STAT_FIELDS:
        torch.testing.assert_close(getattr(log["b"][0], f), ref[f], atol=2e-5, rtol=1e-4)


def test_batching_does_not_change_results(model_a, model_b, tokenizer, rows):
    seqs = sequences_from_rows(rows["test"][:8], tokenizer, "qa")
    together = teacher_forced_stats(model_a, {"b": model_b}, seqs, max_batch_tokens=10_000)
    alone = teacher_forced_stats(model_a, {"b": model_b}, seqs, max_batch_tokens=1)  # one sequence per batch
    for x, y in zip(together["b"], alone["b"]):
        for f in STAT_FIELDS:
            torch.testing.assert_close(getattr(x, f), getattr(y, f), atol=1e-5, rtol=1e-4)


def test_empty_response_and_vocab_mismatch(model_a, tokenizer, rows):
    seqs = sequences_from_rows(rows["test"][:2], tokenizer, "qa")
    seqs.append(ProbeSequence("empty", "p", seqs[0].prompt_ids, ()))
    res = teacher_forced_stats(model_a, {"b": model_a}, seqs)
    assert res["b"][-1].kl_ab.numel() == 0 and res["b"][0].kl_ab.numel() == len(seqs[0].response_ids)
    h = torch.zeros(2, 4)
    head_a = linear_head(model_a)
    from rlvr_core.probe.token_stats import LinearHead
    with pytest.raises(ValueError, match="different vocabularies"):
        token_stats_from_hidden(h, LinearHead(torch.zeros(10, 4)), h, LinearHead(torch.zeros(11, 4)), torch.zeros(2))
    assert head_a.vocab == len(tokenizer)


def test_head_mismatch_is_caught(model_a, tokenizer, rows):
    """A model whose logits are not lm_head(hidden) (here: scaled) is refused on the hidden path."""

    class Scaled(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner
            self.config = inner.config

        def get_output_embeddings(self):
            return self.inner.get_output_embeddings()

        def get_decoder(self):
            return self.inner.get_decoder()

        def forward(self, **kw):
            out = self.inner(**kw)
            out.logits = out.logits * 2.0
            return out

    seqs = sequences_from_rows(rows["test"][:2], tokenizer, "qa")
    with pytest.raises(HeadMismatchError, match="head='logits'"):
        teacher_forced_stats(model_a, {"scaled": Scaled(model_a)}, seqs)
    res = teacher_forced_stats(model_a, {"scaled": Scaled(model_a)}, seqs, head="logits")
    assert float(res["scaled"][0].kl_ba.mean()) > 0
