"""The experiment's stages over everything below (data, warm start, pass rates, curriculum, GRPO, export,
evaluation), their resumable cache, ablation sweeps, and the local stack."""
