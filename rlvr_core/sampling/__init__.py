"""Sampling engines behind one interface (`hf`, `vllm`); see docs/sampling.md.

Importing this package never imports vLLM or torch: the engines live in `sampling.hf` (torch) and
`sampling.vllm` (vLLM, imported when an engine is built); `get_engine` builds either by name.
"""

from rlvr_core.sampling.base import Sample, SamplingEngine, SamplingParams, unique_fraction
from rlvr_core.sampling.registry import get_engine, known_engines, register_engine

__all__ = ["Sample", "SamplingEngine", "SamplingParams", "unique_fraction", "get_engine", "known_engines",
           "register_engine"]
