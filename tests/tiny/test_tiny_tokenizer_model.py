"""Local byte-level BPE tokenizer and the tiny Qwen2 built from a config."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr_core.data.synthetic import SyntheticSpec, make_synthetic_dataset
from rlvr_core.data.templates import get_template
from rlvr_core.tiny.model import build_tiny_model, count_params
from rlvr_core.tiny.tokenizer import train_tokenizer


def _texts(n=200):
    t = get_template("qa")
    rows = make_synthetic_dataset(SyntheticSpec(n_train=n, n_test=0))["train"]
    return [t.render(r["question"]) + " " + r["answer"] for r in rows]


def test_tokenizer_round_trip_specials_and_digits(tmp_path):
    texts = _texts()
    tok = train_tokenizer(texts, vocab_size=400)
    assert len(tok) <= 400
    assert tok.padding_side == "left"
    assert tok.eos_token and tok.pad_token and tok.bos_token
    assert tok.pad_token_id != tok.eos_token_id
    for s in texts[:20] + ["Ünïcödé 12345 — ok?\n#### -7", "  two  spaces\n\n\n"]:
        assert tok.decode(tok(s, add_special_tokens=False)["input_ids"]) == s
    # digits one token each
    toks = tok.convert_ids_to_tokens(tok("#### 12345", add_special_tokens=False)["input_ids"])
    assert [t for t in toks if t.isdigit()] == list("12345")

    tok.save_pretrained(tmp_path)
    re_tok = AutoTokenizer.from_pretrained(tmp_path)
    assert re_tok.padding_side == "left"
    assert (re_tok.eos_token_id, re_tok.pad_token_id, re_tok.bos_token_id) == (
        tok.eos_token_id,
        tok.pad_token_id,
        tok.bos_token_id,
    )
    assert re_tok(texts[:5])["input_ids"] == tok(texts[:5])["input_ids"]
    batch = re_tok(["Question: a", "Question: a much longer one"], padding=True)
    assert batch["input_ids"][0][0] == re_tok.pad_token_id and batch["attention_mask"][0][0] == 0


def test_tokenizer_is_deterministic():
    texts = _texts(100)
    assert train_tokenizer(texts).get_vocab() == train_tokenizer(texts).get_vocab()


def test_model_size_seed_and_save_reload(tmp_path):
    tok = train_tokenizer(_texts(100))
    model = build_tiny_model(tok, seed=0)  # defaults
    assert 1_000_000 <= count_params(model) <= 5_000_000
    assert model.config.model_type == "qwen2"
    assert model.generation_config.eos_token_id == tok.eos_token_id
    assert model.generation_config.pad_token_id == tok.pad_token_id
    same = build_tiny_model(tok, seed=0)
    other = build_tiny_model(tok, seed=1)
    w = model.model.embed_tokens.weight
    assert torch.equal(w, same.model.embed_tokens.weight)
    assert not torch.equal(w, other.model.embed_tokens.weight)

    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    re_model = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    x = tok(["Question: Tom has 3 pens.\nAnswer:"], return_tensors="pt")
    with torch.no_grad():
        assert torch.equal(model.eval()(**x).logits, re_model(**x).logits)
