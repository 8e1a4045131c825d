"""LoRA (peft) in the GRPO trainer: only the adapters train, the KL reference is the base model exactly,
the merged final model equals W + (alpha/r)·B·A worked out by hand from the saved adapter, and exporting
the DeepSpeed checkpoint gives the same model (export merges without peft).

Same tiny model and production path as test_trainer.py (grpo_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from grpo_helpers import tiny_cfg, train_tiny

from rlvr_core.artifacts.export import export_checkpoint
from rlvr_core.experiment.config import ConfigError, parse_config
from rlvr_core.grpo.checkpointing import LORA_ADAPTER
from rlvr_core.grpo.logprobs import sequence_logprobs
from rlvr_core.grpo.update import build_batch

RANK, ALPHA = 4, 8.0


def _state(path: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return {k: v.detach().clone() for k, v in AutoModelForCausalLM.from_pretrained(path).state_dict().items()}


@pytest.fixture(scope="module")
def lora_run(tiny, tmp_path_factory):
    cfg = tiny_cfg(steps=2, lora_rank=RANK, lora_alpha=ALPHA, beta=0.1, lr=5e-2)
    return train_tiny(tiny, tmp_path_factory.mktemp("lora") / "run", cfg)


def test_only_adapters_train_and_the_merge_is_w_plus_scaled_ba(tiny, lora_run):
    from safetensors.torch import load_file

    base, final = _state(tiny[0]), _state(lora_run.final_model_dir)
    assert base.keys() == final.keys()
    adapter = load_file(str(lora_run.final_model_dir.parent / LORA_ADAPTER / "adapter_model.safetensors"))
    a_keys = sorted(k for k in adapter if ".lora_A." in k)
    assert a_keys, adapter.keys()
    merged_by_hand = dict(base)
    for ka in a_keys:
        kb = ka.replace(".lora_A.", ".lora_B.")
        module = ka.split(".lora_A")[0].removeprefix("base_model.model.")
        a, b = adapter[ka].double(), adapter[kb].double()
        assert a.shape[0] == RANK and b.shape[1] == RANK
        merged_by_hand[module + ".weight"] = (base[module + ".weight"].double() + (ALPHA / RANK) * b @ a).float()
    adapted = {ka.split(".lora_A")[0].removeprefix("base_model.model.") + ".weight" for ka in a_keys}
    for k in final:
        torch.testing.assert_close(final[k], merged_by_hand[k], rtol=0, atol=1e-6, msg=k)
        if k in adapted:
            assert not torch.equal(final[k], base[k]), f"{k}: the adapter did not move"
    # Every linear layer of the blocks is adapted ("all-linear"); embeddings, norms and the head are not.
    assert any("q_proj" in k for k in adapted) and any("down_proj" in k for k in adapted)
    assert not any("embed" in k or "norm" in k or "lm_head" in k for k in adapted)


def test_the_kl_reference_is_the_base_model(lora_run):
    # Step 1 starts from B = 0: the policy *is* the base, so the KL to the reference (the policy with
    # its adapters switched off) is exactly zero; after one update it is not.
    rows = pq.read_table(lora_run.steps_path).to_pylist()
    assert rows[0]["kl_ref_mean"] == 0.0 and rows[0]["kl_ref_max"] == 0.0, rows[0]
    assert rows[1]["kl_ref_mean"] > 0.0


def test_export_merges_the_adapters_of_the_deepspeed_checkpoint(tiny, lora_run, tmp_path):
    from transformers import AutoModelForCausalLM

    res = export_checkpoint(lora_run.checkpoints_dir, base_model_dir=tiny[0], out_dir=tmp_path / "export")
    assert res.manifest["lora"]["r"] == RANK and "LoRA adapters merged" in res.manifest["checkpoint"]["consolidation"]
    exported, final = _state(res.out_dir), _state(lora_run.final_model_dir)
    for k in final:
        torch.testing.assert_close(exported[k], final[k], rtol=0, atol=1e-6, msg=k)
    # …and so the same log-probs on a batch.
    batch = build_batch([[5, 6, 7], [8, 9]], [[10, 11, 12, 13], [14]], pad_id=0)
    lp = [sequence_logprobs(AutoModelForCausalLM.from_pretrained(p).eval(), batch)[0]
          for p in (res.out_dir, lora_run.final_model_dir)]
    torch.testing.assert_close(lp[0], lp[1], rtol=0, atol=1e-5)


def test_lora_with_zero3_fails_in_the_config():
    with pytest.raises(ConfigError, match="lora_rank > 0 needs zero_stage 0, 1 or 2"):
        parse_config({"grpo": {"lora_rank": 4, "zero_stage": 3}})


def test_a_killed_lora_run_resumes_to_the_same_weights(tiny, lora_run, tmp_path):
    cfg = tiny_cfg(steps=2, lora_rank=RANK, lora_alpha=ALPHA, beta=0.1, lr=5e-2)
    train_tiny(tiny, tmp_path / "run", cfg, stop_after_steps=1)  # "killed" after its step-1 checkpoint
    resumed = train_tiny(tiny, tmp_path / "run", cfg)
    assert (resumed.summary["steps"], resumed.summary["resumed_from_step"], resumed.summary["done"]) == (2, 1, True)
    a, b = pq.read_table(lora_run.steps_path).to_pylist(), pq.read_table(resumed.steps_path).to_pylist()
    for ra, rb in zip(a, b):
        assert ra["reward_mean"] == rb["reward_mean"]  # same prompts, same seeds, same weights
        assert ra["loss"] == pytest.approx(rb["loss"], abs=1e-5)
    straight, again = _state(lora_run.final_model_dir), _state(resumed.final_model_dir)
    for k in straight:  # the tolerance of the full fine-tuning resume test (test_trainer.py)
        torch.testing.assert_close(again[k], straight[k], atol=1e-5, rtol=1e-4, msg=k)


def test_the_adapters_start_from_the_seed_not_the_global_rng(tiny):
    from transformers import AutoModelForCausalLM

    from rlvr_core.grpo.policy import with_lora

    cfg = tiny_cfg(lora_rank=RANK, lora_alpha=ALPHA)
    made = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        m = with_lora(AutoModelForCausalLM.from_pretrained(tiny[0]), cfg, seed=7)
        made.append({k: v.detach().clone() for k, v in m.named_parameters() if "lora_A" in k})
    assert made[0] and all(torch.equal(made[0][k], made[1][k]) for k in made[0])
