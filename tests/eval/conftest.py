"""Two tiny warm-started checkpoints (different training lengths), saved like hub models; nothing downloaded."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory):
    """(weaker, stronger): 30 and 90 warm-start steps of the same small model on the synthetic task."""
    import torch

    from rlvr_core.data.synthetic import SyntheticSpec, make_synthetic_dataset
    from rlvr_core.tiny.warmstart import WarmStartSpec, warm_start

    torch.set_num_threads(1)
    rows = make_synthetic_dataset(SyntheticSpec(n_train=400, n_test=8, seed=0))["train"]
    root = tmp_path_factory.mktemp("ckpt")
    out = []
    for steps in (30, 90):
        spec = WarmStartSpec(steps=steps, batch_size=16, lr=3e-3, seed=0, hidden_size=64, num_layers=2, heads=2,
                             warmup_steps=5)
        out.append(warm_start(rows, root / f"steps{steps}", spec))
    return tuple(out)
