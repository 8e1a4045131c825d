"""HFEngine against independent references: transformers' own generate and a teacher-forced forward."""

import pytest
import torch

from rlvr_core.core.seeding import request_seed
from rlvr_core.sampling import SamplingParams, get_engine, unique_fraction
from rlvr_core.sampling.hf import HFEngine, process_logits

PROMPTS = ["Question: Natalia sold 48 clips in April. How many in May?\nAnswer:",
           "Problem:\nFind $x$.\n\nSolution:",
           "Hi",
           "Betty is saving money for a new wallet which costs $100. Her parents give her $15. Answer:"]
IDS = ["gsm8k/0", "math/1", "toy/2", "gsm8k/3"]


def engine(model, tokenizer, **kw):
    return get_engine("hf", model=model, tokenizer=tokenizer, **kw)


def flat(groups):
    return [s for g in groups for s in g]


def same_samples(a, b, atol=1e-5):
    """Equal samples: identical text, tokens, finish reason and seed; log-probs equal up to float noise
    (a row's logits depend on the batch shape in the last bits: summation order, not values)."""
    fa, fb = flat(a), flat(b)
    assert [len(g) for g in a] == [len(g) for g in b]
    for x, y in zip(fa, fb):
        assert (x.prompt_id, x.sample_index, x.text, x.token_ids, x.finish_reason, x.seed) == \
               (y.prompt_id, y.sample_index, y.text, y.token_ids, y.finish_reason, y.seed)
        assert x.logprobs == pytest.approx(y.logprobs, abs=atol)
    return True


def test_same_seed_twice_identical_and_seeds_recorded(model, tokenizer):
    p = SamplingParams(n=3, temperature=1.0, max_new_tokens=20, seed=7)
    a = engine(model, tokenizer).generate(PROMPTS, IDS, p, step=2)
    b = engine(model, tokenizer).generate(PROMPTS, IDS, p, step=2)
    assert a == b
    for i, group in enumerate(a):
        assert [s.sample_index for s in group] == [0, 1, 2]
        assert all(s.prompt_id == IDS[i] for s in group)
        assert [s.seed for s in group] == [request_seed(7, IDS[i], 2, k) for k in range(3)]


def test_different_indices_steps_and_prompt_ids_differ(model, tokenizer):
    p = SamplingParams(n=8, temperature=1.0, max_new_tokens=12, seed=1)
    eng = engine(model, tokenizer)
    groups = eng.generate(PROMPTS, IDS, p)
    for g in groups:
        assert unique_fraction(g) == 1.0
    other_step = eng.generate(PROMPTS, IDS, p, step=1)
    assert all(x.token_ids != y.token_ids for x, y in zip(flat(groups), flat(other_step)))
    same_text_other_id = eng.generate([PROMPTS[0]], ["gsm8k/0-copy"], p)[0]
    assert all(x.token_ids != y.token_ids for x, y in zip(groups[0], same_text_other_id))


def test_batch_size_does_not_change_samples(model, tokenizer):
    p = SamplingParams(n=3, temperature=0.9, top_p=0.95, top_k=100, max_new_tokens=24, stop=("e",), seed=3)
    one = engine(model, tokenizer, batch_size=1).generate(PROMPTS, IDS, p)
    many = engine(model, tokenizer, batch_size=64).generate(PROMPTS, IDS, p)
    five = engine(model, tokenizer, batch_size=5).generate(PROMPTS, IDS, p)
    assert same_samples(one, many) and same_samples(one, five)
    # a prompt's samples do not depend on which other prompts are in the request either
    assert same_samples(engine(model, tokenizer).generate(PROMPTS[1:2], IDS[1:2], p), many[1:2])


def test_lockstep_runs_the_other_ranks_forwards_and_samples_the_same(model, tokenizer):
    """Lockstep (ZeRO-3 sampling on the partitioned policy): `lockstep(n)` stands in for the max over ranks.
    Pretending another rank has 2 more decode batches and rows active for 30 token steps, this rank runs
    exactly that many forward calls (prefill + a call per token step of every batch, dummies included), and
    its samples are those of the plain engine. An empty call joins the others with dummy batches only."""
    p = SamplingParams(n=2, temperature=1.0, max_new_tokens=30, stop=("e",), seed=5)
    plain = engine(model, tokenizer, batch_size=4).generate(PROMPTS, IDS, p)
    state = {"steps": 0}

    def other_rank(n):  # first call: batch count; then per token step the other rank's active rows
        if state["steps"] == 0:
            state["steps"] = 1
            return n + 2
        state["steps"] += 1
        return max(n, 1 if (state["steps"] - 2) % 30 < 29 else 0)

    calls = []
    hook = model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        locked = HFEngine(model, tokenizer, batch_size=4, lockstep=other_rank).generate(PROMPTS, IDS, p)
        n_batches = 8 // 4 + 2
        assert len(calls) == n_batches * 30  # prefill + 29 token-step forwards, per batch
        assert same_samples(plain, locked)
        calls.clear()
        state["steps"] = 0
        assert HFEngine(model, tokenizer, batch_size=4, lockstep=other_rank).generate([], [], p) == []
        assert len(calls) == 2 * 30
    finally:
        hook.remove()


def test_chunks_from_first_sample_index_are_one_larger_draw(model, tokenizer):
    # Adaptive sampling asks for a prompt's completions in chunks: indices 0-2, then 3-7 must be what one
    # call for 8 gives (same seeds, same tokens), whichever prompts share the later call.
    p = SamplingParams(n=8, temperature=1.0, max_new_tokens=16, seed=5)
    eng = engine(model, tokenizer)
    whole = eng.generate(PROMPTS, IDS, p, step=3, epoch=1)
    head = eng.generate(PROMPTS, IDS, SamplingParams(n=3, temperature=1.0, max_new_tokens=16, seed=5), step=3, epoch=1)
    tail = eng.generate(PROMPTS[1:3], IDS[1:3], SamplingParams(n=5, temperature=1.0, max_new_tokens=16, seed=5),
                        step=3, epoch=1, first_sample_index=3)
    assert [s.sample_index for s in tail[0]] == [3, 4, 5, 6, 7]
    assert same_samples([h + t for h, t in zip(head[1:3], tail)], whole[1:3])
    assert same_samples([g[:3] for g in whole], head)


def test_greedy_equals_transformers_generate(model, tokenizer):
    p = SamplingParams(n=1, temperature=0.0, max_new_tokens=16)
    got = engine(model, tokenizer, batch_size=4).generate(PROMPTS, IDS, p)  # batched: rows are left-padded
    for prompt, (sample,) in zip(PROMPTS, got):
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=16,
                             pad_token_id=tokenizer.pad_token_id)
        assert sample.token_ids == ref[0, ids.shape[1]:].tolist()


def teacher_forced_logprobs(model, prompt_ids, completion_ids):
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    positions = torch.arange(len(prompt_ids) - 1, len(prompt_ids) + len(completion_ids) - 1)
    return lp[positions, torch.tensor(completion_ids)], logits[positions]


def test_logprobs_are_raw_teacher_forced_logprobs(model, tokenizer):
    p = SamplingParams(n=2, temperature=0.7, top_p=0.8, top_k=50, max_new_tokens=20, seed=11)
    groups = engine(model, tokenizer, batch_size=8).generate(PROMPTS, IDS, p)
    max_processed_gap = 0.0
    for prompt, group in zip(PROMPTS, groups):
        prompt_ids = tokenizer(prompt)["input_ids"]
        for s in group:
            assert len(s.logprobs) == len(s.token_ids)
            ref, logits = teacher_forced_logprobs(model, prompt_ids, s.token_ids)
            assert torch.allclose(torch.tensor(s.logprobs), ref, atol=1e-4, rtol=0)
            processed = torch.log_softmax(process_logits(logits, 0.7, 50, 0.8), dim=-1)
            gap = (processed.gather(-1, torch.tensor(s.token_ids)[:, None])[:, 0] - ref).abs().max()
            max_processed_gap = max(max_processed_gap, float(gap))
    assert max_processed_gap > 1e-2  # the test can tell raw from processed log-probs


def test_pad_id_inside_prompt_and_pad_value_irrelevant(model, tokenizer):
    # G-pad-mask: prompt masks come from lengths, so a pad token inside a prompt is a real token.
    pad, eos = tokenizer.pad_token, tokenizer.eos_token
    prompt = f"Question: {pad} two {pad}{pad} and {eos} zero\nAnswer:"
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    assert tokenizer.pad_token_id in ids[0].tolist()
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    # batched with a longer prompt, so this row is left-padded as well as containing the pad id
    got = engine(model, tokenizer).generate([PROMPTS[3], prompt], ["long", "padded"], greedy)[1][0]
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=12,
                         pad_token_id=tokenizer.pad_token_id)
    assert got.token_ids == ref[0, ids.shape[1]:].tolist()

    sampled = SamplingParams(n=4, temperature=1.0, max_new_tokens=16, seed=5)
    base = engine(model, tokenizer).generate([PROMPTS[3], prompt], ["long", "padded"], sampled)
    for filler in (0, 17, tokenizer.pad_token_id):
        assert same_samples(engine(model, tokenizer, pad_token_id=filler).generate(
            [PROMPTS[3], prompt], ["long", "padded"], sampled), base)


def first_prefix_containing(tokenizer, tokens, stop):
    for m in range(1, len(tokens) + 1):
        if stop in tokenizer.decode(tokens[:m], skip_special_tokens=True):
            return m
    return None


def test_stop_sequences_cut_text_and_tokens(model, tokenizer):
    # G-stop-seq: the engine cuts each completion at its first stop string.
    free = SamplingParams(n=4, temperature=1.0, max_new_tokens=30, seed=9)
    eng = engine(model, tokenizer, batch_size=3, eos_token_ids=[])  # only max_new_tokens or a stop string
    unconstrained = flat(eng.generate(PROMPTS, IDS, free))
    assert all(s.finish_reason == "length" and len(s.token_ids) == 30 for s in unconstrained)
    for s in unconstrained:
        full = tokenizer.decode(s.token_ids, skip_special_tokens=True)
        stop = tokenizer.decode(s.token_ids[6:9], skip_special_tokens=True)  # spans several tokens
        assert stop and stop in full
        pid = s.prompt_id
        (cut,) = [g for g in eng.generate([PROMPTS[IDS.index(pid)]], [pid],
                                          SamplingParams(**{**free.__dict__, "stop": ("\x00never", stop)}))[0]
                  if g.sample_index == s.sample_index]
        m = first_prefix_containing(tokenizer, s.token_ids, stop)
        assert cut.finish_reason == "stop"
        assert cut.text == full[:full.index(stop)]
        assert cut.token_ids == s.token_ids[:m] and cut.logprobs == pytest.approx(s.logprobs[:m], abs=1e-6)
        assert stop not in cut.text


def test_stop_completed_by_last_allowed_token_is_stop(model, tokenizer):
    free = SamplingParams(n=1, temperature=1.0, max_new_tokens=10, seed=4)
    (s,) = engine(model, tokenizer, eos_token_ids=[]).generate(PROMPTS[:1], IDS[:1], free)[0]
    full = tokenizer.decode(s.token_ids, skip_special_tokens=True)
    for stop in [tokenizer.decode(s.token_ids[-2:], skip_special_tokens=True)]:
        if full.index(stop) + len(stop) != len(full) or first_prefix_containing(tokenizer, s.token_ids, stop) != 10:
            pytest.skip("sampled tail also occurs earlier; choose another seed")
        (cut,) = engine(model, tokenizer, eos_token_ids=[]).generate(PROMPTS[:1], IDS[:1],
                                                  SamplingParams(**{**free.__dict__, "stop": (stop,)}))[0]
        assert cut.finish_reason == "stop" and cut.token_ids == s.token_ids


def test_eos_finishes_with_stop_and_keeps_the_eos_token(model, tokenizer):
    free = SamplingParams(n=2, temperature=1.0, max_new_tokens=25, seed=2)
    base = engine(model, tokenizer, eos_token_ids=[]).generate(PROMPTS[:2], IDS[:2], free)
    for group in base:
        for s in group:
            fake_eos = s.token_ids[5]  # treat a token the sample does produce as end-of-sequence
            (cut,) = [g for g in engine(model, tokenizer, eos_token_ids=[fake_eos]).generate(
                PROMPTS[:2], IDS[:2], free)[IDS.index(s.prompt_id)] if g.sample_index == s.sample_index]
            first = s.token_ids.index(fake_eos)
            assert cut.finish_reason == "stop"
            assert cut.token_ids == s.token_ids[:first + 1]
            assert len(cut.logprobs) == first + 1


def test_greedy_ignores_seed_and_top_p(model, tokenizer):
    a = engine(model, tokenizer).generate(PROMPTS, IDS, SamplingParams(n=2, temperature=0.0, max_new_tokens=8, seed=1))
    b = engine(model, tokenizer).generate(PROMPTS, IDS, SamplingParams(n=2, temperature=0.0, top_p=0.5,
                                                                       max_new_tokens=8, seed=2))
    assert [[s.token_ids for s in g] for g in a] == [[s.token_ids for s in g] for g in b]
    assert all(unique_fraction(g) == 0.5 for g in a)  # greedy: both samples identical


def test_process_logits_against_explicit_sets():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(process_logits(logits, 1.0, 2, 1.0)).tolist() == [[False, False, True, True]]
    # 0.5 < 0.7 so the second token is needed; 0.5 + 0.3 >= 0.7 so the third is not
    assert torch.isinf(process_logits(logits, 1.0, 0, 0.7)).tolist() == [[False, False, True, True]]
    assert torch.isinf(process_logits(logits, 1.0, 0, 0.1)).tolist() == [[False, True, True, True]]
    assert torch.allclose(process_logits(logits, 2.0, 0, 1.0), logits / 2)


def test_input_validation(model, tokenizer):
    eng = engine(model, tokenizer)
    with pytest.raises(ValueError, match="repeated prompt ids"):
        eng.generate(["a", "b"], ["x", "x"], SamplingParams())
    with pytest.raises(ValueError, match="prompt ids"):
        eng.generate(["a", "b"], ["x"], SamplingParams())
    for bad in [dict(n=0), dict(temperature=-1), dict(top_p=0.0), dict(top_k=-1), dict(max_new_tokens=0)]:
        with pytest.raises(ValueError):
            SamplingParams(**bad)
    with pytest.raises(TypeError):
        SamplingParams(stop="\n")
    assert SamplingParams(stop=["a"]).stop == ("a",)
    assert isinstance(eng, HFEngine)
    with pytest.raises(KeyError, match="known"):
        get_engine("nope")


def test_real_eos_token_kept_in_ids_but_not_in_text(model, tokenizer):
    p = SamplingParams(n=4, temperature=1.0, max_new_tokens=30, seed=9)
    samples = flat(engine(model, tokenizer).generate(PROMPTS, IDS, p))
    ended = [s for s in samples if s.token_ids[-1] == tokenizer.eos_token_id]
    assert ended, "this seed produced no eos; pick a seed that does"
    for s in ended:
        assert s.finish_reason == "stop" and len(s.token_ids) < 30
        assert tokenizer.eos_token not in s.text
        assert s.text == tokenizer.decode(s.token_ids[:-1])
    assert all(s.finish_reason == "length" for s in samples if s not in ended)
