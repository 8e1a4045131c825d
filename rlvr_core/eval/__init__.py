"""Evaluation: benchmarks sampled and scored (evaluate), and two evaluations compared with paired statistics
(compare)."""
