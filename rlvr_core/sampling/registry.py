"""Engines by name, so configs say `engine: hf` or `engine: vllm` and nothing imports vLLM on CPU.

The engines are the "sampling_engine" kind of the project's one registry (rlvr_core/core/registry.py lists
their names); each factory below registers itself."""

from __future__ import annotations

from rlvr_core.core.registry import SAMPLING_ENGINES, register
from rlvr_core.sampling.base import SamplingEngine
from rlvr_core.sampling.vllm import VLLMEngine  # imports vllm only when an engine is built

__all__ = ["get_engine", "register_engine", "known_engines"]

register_engine = SAMPLING_ENGINES.add  # register_engine(name, factory)
known_engines = SAMPLING_ENGINES.names


def get_engine(name: str, **kwargs) -> SamplingEngine:
    """Build the engine registered under `name` with kwargs (hf: model, tokenizer, batch_size, device)."""
    return SAMPLING_ENGINES.get(name)(**kwargs)


@register("sampling_engine", "hf")
def _hf(**kwargs) -> SamplingEngine:
    from rlvr_core.sampling.hf import HFEngine

    return HFEngine(**kwargs)


@register("sampling_engine", "vllm")
def _vllm(**kwargs) -> SamplingEngine:
    return VLLMEngine(**kwargs)
