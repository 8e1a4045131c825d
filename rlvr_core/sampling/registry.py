"""Engines by name, so configs say `engine: hf` or `engine: vllm` and nothing imports vLLM on CPU."""

from __future__ import annotations

from typing import Callable

from rlvr_core.sampling.base import SamplingEngine
from rlvr_core.sampling.vllm import VLLMEngine  # imports vllm only when an engine is built

__all__ = ["get_engine", "register_engine", "known_engines"]

_FACTORIES: dict[str, Callable[..., SamplingEngine]] = {}


def register_engine(name: str, factory: Callable[..., SamplingEngine]) -> None:
    if name in _FACTORIES:
        raise ValueError(f"sampling engine {name!r} registered twice")
    _FACTORIES[name] = factory


def known_engines() -> list[str]:
    return sorted(_FACTORIES)


def get_engine(name: str, **kwargs) -> SamplingEngine:
    """Build the engine registered under `name` with kwargs (hf: model, tokenizer, batch_size, device)."""
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise KeyError(f"unknown sampling engine {name!r}; known: {known_engines()}") from None
    return factory(**kwargs)


def _hf(**kwargs) -> SamplingEngine:
    from rlvr_core.sampling.hf import HFEngine

    return HFEngine(**kwargs)


def _vllm(**kwargs) -> SamplingEngine:
    return VLLMEngine(**kwargs)


register_engine("hf", _hf)
register_engine("vllm", _vllm)
