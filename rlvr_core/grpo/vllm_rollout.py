"""Rollouts from a colocated vLLM engine (`engine="vllm"`), with the policy's weights pushed into it in place.

Every rank builds its own in-process engine from the base model folder, after DeepSpeed has created the
process group (under a launcher vLLM then runs with its `external_launcher` executor inside that group, as
colocated trainers on GPU do). Before each on-policy rollout the trainer hands `sync` the module that holds
the policy's full current weights (the policy itself, or under ZeRO-3 the replica it has just gathered the
partitions into, collectively); `engine_weights` turns it into Hugging Face-named tensors — LoRA adapters
merged into their base weights, the PEFT wrapper's names removed — and the engine reloads them in place and
drops its prefix cache (vllm.py, `load_weights`). So the first rollout of a resumed run already samples with
the checkpoint's weights, and a weight that was not pushed shows up at once as a log-prob gap between the
engine and the trainer (the G-onpolicy-ratio flag and the `logprob_mismatch/*` metrics).

With bounded staleness the ahead sampler's thread calls `load` with the version a step needs (a snapshot of
`engine_weights` taken by the trainer when it published that version); the trainer itself never samples then.

Tied embeddings need nothing special: vLLM's Qwen2/Llama loaders skip `lm_head.weight` when the config ties it.
"""

from __future__ import annotations

import contextlib

from pathlib import Path
from typing import Iterator

import torch

from rlvr_core.sampling.vllm import VLLMEngine

__all__ = ["VLLMRolloutEngine", "engine_weights"]


def _is_peft(module) -> bool:
    return hasattr(module, "peft_config") and hasattr(module, "base_model")


def engine_weights(module) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, tensor) of every weight of `module`'s model as an inference engine loads it.

    A PEFT (LoRA) model gives its base model's names with each adapted layer's merged weight W + ΔW (peft's
    own `get_delta_weight`, so scaling and fan_in_fan_out are peft's); the policy itself is not modified
    (merging in place and back would leave rounding residue in the base weights)."""
    if not _is_peft(module):
        yield from module.state_dict().items()
        return
    from peft.tuners.lora import LoraLayer

    inner = module.base_model.model  # the transformers model, with LoRA layers wrapping its linears
    merged: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, sub in inner.named_modules():
            if isinstance(sub, LoraLayer) and sub.active_adapters:
                w = sub.get_base_layer().weight
                delta = sum(sub.get_delta_weight(a) for a in sub.active_adapters if a in sub.lora_A)
                merged[f"{name}.weight"] = (w + delta).to(w.dtype)
        for key, tensor in inner.state_dict().items():
            if ".lora_" in key:
                continue
            key = key.replace(".base_layer.", ".")
            yield key, merged.get(key, tensor)


def gathered_whole(module):
    """Every weight of a ZeRO-3 partitioned `module` gathered whole while the context is open (a collective);
    a plain module's context does nothing."""
    params = [p for p in module.parameters() if hasattr(p, "ds_id")]
    if not params:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, modifier_rank=None)


class VLLMRolloutEngine:
    """The trainer's rollout engine on vLLM (see the module docstring).

    model_dir: the base model folder (architecture, tokenizer files, initial weights). tokenizer: the
    trainer's own tokenizer object, so the engine encodes prompts exactly as the trainer re-encodes them.
    llm_kwargs: overrides of `rlvr_core.sampling.vllm.default_llm_kwargs` (dtype, KV cache, GPU memory share).
    """

    name = "vllm"

    def __init__(self, model_dir: str | Path, tokenizer, **llm_kwargs):
        self.sampler = VLLMEngine(model_dir, tokenizer=tokenizer, **llm_kwargs)
        self.pushes = 0  # weight pushes so far (a metric, and what tests count)

    def sync(self, module) -> None:
        """Push the policy's current weights. A ZeRO-3 partitioned module's weights are gathered whole for the
        push (collective: the trainer calls sync on every rank), then freed again."""
        with gathered_whole(module):
            self.sampler.load_weights(engine_weights(module))
        self.pushes += 1

    def snapshot(self, module) -> dict[str, torch.Tensor]:
        """A detached copy of one policy version, in the form `load` takes."""
        return {k: v.detach().clone() for k, v in engine_weights(module)}

    def load(self, weights: dict[str, torch.Tensor]) -> None:
        self.sampler.load_weights(weights.items())
        self.pushes += 1

    def close(self) -> None:
        self.sampler.close()
