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

Nothing here imports Prefect. The package imports none of its modules (several import torch): import the
one you need.
"""
