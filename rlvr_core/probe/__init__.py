"""Probes: what did RL change between two (or more) checkpoints? (issue 9; docs/probes.md)

| module | what |
|---|---|
| `token_stats` | teacher-forced per-token KL both ways, entropies, log-probs and Δlog p over the full vocabulary, vocabulary-chunked |
| `categories` | token categories (number, math symbol, variable, punctuation, logical, step marker, other) |
| `spikes` | spike rule and turning points of a trajectory across checkpoints |
| `tables` | the Parquet tables (`probe_tokens`, `probe_problems`, …) and their schemas |
| `report` | the RL-Probe report (seed 000): slice, score, mark, summarise, markdown + figures |
| `decoding` | two-model guided decoding: selective token replacement, test-time extrapolation |
| `dlogp` | the Δlog p analysis (seed 004) |
| `boundary` | capability boundary: pass@k, accuracy histogram, solvable overlap, perplexity (seed 003) |

The command line (`rlvr probe tokens | report | dlogp | boundary`) is `rlvr_cli/probe.py`.

Nothing here imports Prefect; heavy imports (torch, transformers, matplotlib) happen in the modules
that need them, so importing the package is cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ProbeSequence": "token_stats", "TokenStats": "token_stats", "teacher_forced_stats": "token_stats",
    "token_stats_from_logits": "token_stats", "token_stats_from_hidden": "token_stats",
    "categorize_text": "categories", "CATEGORIES": "categories",
    "SpikeRule": "spikes", "detect_spikes": "spikes", "turning_points": "spikes",
    "Checkpoint": "tables", "token_table": "tables", "summarise": "tables",
    "ProbeSettings": "report", "run_rl_probe": "report", "select_problems": "report",
    "Guide": "decoding", "GuidedEngine": "decoding",
    "DlogpSettings": "dlogp", "run_dlogp_analysis": "dlogp",
    "BoundarySettings": "boundary", "run_boundary_analysis": "boundary",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"rlvr_core.probe.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'rlvr_core.probe' has no attribute {name!r}")
