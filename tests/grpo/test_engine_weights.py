"""`engine_weights`: what the trainer pushes into a vLLM engine, checked against peft's own merge and against
the plain state dict (no vLLM needed: this is the conversion, the push itself is tested in test_trainer_vllm.py)."""

from __future__ import annotations

import copy

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlvr_core.experiment.config import GRPOConfig
from rlvr_core.grpo.vllm_rollout import engine_weights


def _model(tied: bool) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=tied)
    return Qwen2ForCausalLM(cfg).eval()


def test_a_plain_model_gives_its_state_dict_names_and_tensors():
    m = _model(tied=True)
    got = dict(engine_weights(m))
    ref = m.state_dict()
    assert list(got) == list(ref)
    assert all(got[k] is ref[k] or torch.equal(got[k], ref[k]) for k in ref)


def test_lora_weights_are_merged_like_peft_merge_and_unload_and_the_policy_is_untouched():
    from rlvr_core.grpo.policy import with_lora

    policy = with_lora(_model(tied=False), GRPOConfig(lora_rank=4, lora_alpha=8), seed=0)
    with torch.no_grad():  # trained adapters: B = 0 at init would make the merge trivially equal
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    got = dict(engine_weights(policy))
    ref = copy.deepcopy(policy).merge_and_unload().state_dict()
    assert sorted(got) == sorted(ref)  # Hugging Face names: no base_model.model., .base_layer. or lora_ keys
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=0, atol=1e-6, msg=k)
    changed = [k for k in ref if not torch.equal(got[k], _model(tied=False).state_dict()[k])]
    assert any("q_proj" in k for k in changed)  # the adapters did change the pushed weights
    after = policy.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
