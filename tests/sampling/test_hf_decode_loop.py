"""The `hf` decode loop of issue 41 (device buffers, a stop automaton, uniforms drawn once per batch) against
the loop it replaced, kept verbatim in hf_reference.py: same samples bit for bit on CPU (tokens, texts, finish
reasons, log-probs), and stop strings found at exactly the token where decoding the tail first shows them."""

import random

import pytest
import torch
import torch._dynamo.utils
from hf_reference import HFEngine as ReferenceEngine
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from rlvr_core.sampling import SamplingParams
from rlvr_core.sampling.base import find_stop
from rlvr_core.sampling.hf import HFEngine
from rlvr_core.sampling.stops import StopAutomaton, token_bytes

PROMPTS = ["Question: Natalia sold 48 clips in April. How many in May?\nAnswer:", "Problem:\nFind $x$.\n\nSolution:",
           "Hi", "Ünïcödé tëxt — and emoji", "Betty is saving money for a new wallet which costs $100. Answer:"]
IDS = [f"p/{i}" for i in range(len(PROMPTS))]


def both(model, tokenizer, params, **kw):
    new = HFEngine(model, tokenizer, **kw).generate(PROMPTS, IDS, params, step=1)
    old = ReferenceEngine(model, tokenizer, **kw).generate(PROMPTS, IDS, params, step=1)
    return new, old


def free_texts(model, tokenizer, params):
    """Decoded samples of `params` without stop strings or eos: stop strings cut out of them do occur."""
    p = SamplingParams(**{**params.__dict__, "stop": ()})
    return [s.text for g in HFEngine(model, tokenizer, eos_token_ids=[]).generate(PROMPTS, IDS, p, step=1) for s in g]


@pytest.mark.parametrize("case", [
    dict(params=dict(temperature=1.0), kw=dict(batch_size=64)),
    dict(params=dict(temperature=0.7, top_p=0.9, top_k=40), kw=dict(batch_size=3)),
    dict(params=dict(temperature=0.0), kw=dict(batch_size=4)),
    dict(params=dict(temperature=1.3, top_k=5), kw=dict(batch_size=1, eos_token_ids=[]))])
def test_samples_bit_identical_to_the_old_loop(model, tokenizer, case):
    """With stop strings that occur (2-4 characters cut from free samples at arbitrary offsets, so they start
    and end inside tokens), eos, and max_new_tokens: every field equal, log-probs exactly (same shapes)."""
    params = SamplingParams(n=3, max_new_tokens=24, seed=5, **case["params"])
    rng, stops = random.Random(0), []
    for text in free_texts(model, tokenizer, params)[::3]:
        i = rng.randrange(len(text) // 2, max(len(text) // 2 + 1, len(text) - 4))
        stops.append(text[i:i + rng.randint(2, 4)])
    params = SamplingParams(**{**params.__dict__, "stop": tuple(s for s in stops if s)})
    new, old = both(model, tokenizer, params, **case["kw"])
    assert new == old
    reasons = {s.finish_reason for g in new for s in g}
    assert case["params"]["temperature"] == 0 or reasons == {"stop", "length"}  # both paths were exercised


def test_stop_automaton_flags_the_step_the_decoded_tail_first_holds_a_stop(model, tokenizer):
    """The automaton against the old check on random token streams, biased to tokens that split multi-byte
    characters (partial UTF-8) and to multi-token stops, with and without special tokens in between: the
    first step flagged is the first step at which decoding the last window of tokens shows a stop string."""
    table = token_bytes(tokenizer, len(tokenizer) + 3)  # ids past the tokenizer decode to nothing
    assert table is not None and table[tokenizer.eos_token_id] == b"" and table[-1] == b""
    multi = [i for i, b in enumerate(table) if any(x >= 0x80 for x in b)]
    assert any(b and b[0] >= 0x80 and (b[0] & 0xC0) == 0x80 for b in (table[i] for i in multi))  # split chars
    engine = HFEngine(model, tokenizer, eos_token_ids=[])
    rng = random.Random(1)
    fired = multibyte = 0
    for trial in range(150):
        ids = [rng.choice(multi) if rng.random() < 0.5 else rng.randrange(len(table)) for _ in range(40)]
        text = tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        pieces = [text[i:i + k] for i in range(len(text)) for k in (1, 2, 3) if "\ufffd" not in text[i:i + k]]
        stop = (rng.choice(pieces), "\nQuestion:")
        multibyte += len(stop[0].encode()) > len(stop[0])
        auto = StopAutomaton(table, stop, [], "cpu")
        window, state, first_auto, first_old = engine._stop_window(stop), 0, None, None
        for t, tok in enumerate(ids):
            code = int(auto.code[state, tok])
            state = code >> 2
            if first_auto is None and code & 2:
                first_auto = t
            if first_old is None and find_stop(engine._decode(ids[:t + 1][-window:]), stop) >= 0:
                first_old = t
        assert first_auto == first_old, (ids, stop)
        fired += first_old is not None
    assert fired == 150 and multibyte > 10


def test_no_tail_decoding_per_token(model, tokenizer, monkeypatch):
    """With stop strings, the tokenizer decodes once per confirmed stop and once per sample at the end, not
    once per row per token (the engine's first call also builds its byte table: not counted)."""
    calls = []
    real = type(tokenizer).decode
    monkeypatch.setattr(type(tokenizer), "decode", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    p = SamplingParams(n=4, temperature=1.0, max_new_tokens=30, stop=("e", "\nQuestion:"), seed=2)
    engine = HFEngine(model, tokenizer)
    engine.generate(PROMPTS[:1], IDS[:1], p)
    calls.clear()
    samples = [s for g in engine.generate(PROMPTS, IDS, p) for s in g]
    stopped = sum(s.finish_reason == "stop" for s in samples)
    assert len(calls) <= stopped + len(samples) < sum(len(s.token_ids) for s in samples)


def metaspace_tokenizer():
    """A SentencePiece-style tokenizer (Metaspace decoder: decoding strips a leading space, so text is not
    the concatenation of token bytes): the engine must fall back to the exact check on every token."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    corpus = PROMPTS + ["Answer: In May she sold 48 / 2 = 24 clips. In total she sold 48 + 24 = 72 clips.",
                        "The quick brown fox jumps over the lazy dog; numbers 0 1 2 3 4 5 6 7 8 9 10 100."]
    tok.train_from_iterator(corpus * 20, trainer=trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>", "<|pad|>"], show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|pad|>")


def tiny_qwen2(tok):
    torch.manual_seed(1)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, bos_token_id=None, tie_word_embeddings=False)
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # sharper than the init's near-uniform logits
    return model


def test_non_byte_level_tokenizer_falls_back_and_matches_the_old_loop():
    torch.set_num_threads(1)
    tok = metaspace_tokenizer()
    assert token_bytes(tok, len(tok)) is None
    model = tiny_qwen2(tok)
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=20, seed=1)
    texts = free_texts(model, tok, params)
    params = SamplingParams(**{**params.__dict__, "stop": tuple(t[8:10] for t in texts[::3] if t[8:10])})
    new, old = both(model, tok, params, batch_size=4)
    assert new == old
    assert any(s.finish_reason == "stop" and len(s.token_ids) < 20 for g in new for s in g)


def test_graphed_step_equals_the_eager_loop(model, tokenizer):
    """compile=True (static cache, finished rows kept, one compiled forward per token), traced on CPU by
    torch.compile's eager backend with fullgraph=True (so the step is one graph, as CUDA graphs need), against
    the eager loop: same tokens, texts and finish reasons (stops, eos and the length cap all occur), log-probs
    within 1e-5; 5 prompts x 2 at batch_size 4, so the last batch is filled with dummy rows."""
    eager = HFEngine(model, tokenizer, batch_size=4)
    graphed = HFEngine(model, tokenizer, batch_size=4, compile=True, compile_backend="eager")
    assert eager.compile is False  # the default on a CPU
    for temperature in (0.0, 1.0):
        params = SamplingParams(n=2, temperature=temperature, max_new_tokens=20, seed=3)
        stops = tuple(t[6:8] for t in free_texts(model, tokenizer, params)[::4] if t[6:8])
        params = SamplingParams(**{**params.__dict__, "stop": stops})
        a = eager.generate(PROMPTS, IDS, params, step=1)
        b = graphed.generate(PROMPTS, IDS, params, step=1)
        for x, y in zip([s for g in a for s in g], [s for g in b for s in g]):
            assert (x.text, x.token_ids, x.finish_reason, x.seed) == (y.text, y.token_ids, y.finish_reason, y.seed)
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)
        assert {s.finish_reason for g in a for s in g} == {"stop", "length"}
    assert list(graphed._static_caches) == [(4, 64 + 20)]  # 4 rows, the prompt bucket + 20 new tokens
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # traced as one graph (fullgraph=True)
    with pytest.raises(ValueError, match="lockstep"):
        HFEngine(model, tokenizer, compile=True, lockstep=lambda n: n)
