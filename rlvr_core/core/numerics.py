"""What besides the seed decides a CPU run's floating point: the thread count and the CPU's instruction set.

Training and sampling on CPU are deterministic for a fixed seed, thread count and machine, whatever else
the machine is doing (tests/grpo/test_determinism_under_load.py). A different intra-op thread count
splits reductions differently and a different instruction set (AVX2, AVX-512) rounds differently, and a
few hundred optimizer steps amplify either into a different trajectory. So both travel with every run's
settings and into the cache keys of the finished stages whose outputs they change (warm start, pass rates).
GRPO records them but leaves them out of its folder's key, so a run resumes from its checkpoint on another
host or at another thread count (the change goes into its summary: `numerics_changes`).
"""

from __future__ import annotations

__all__ = ["numerics"]


def numerics() -> dict[str, object]:
    """{"torch_threads": intra-op threads now, "cpu_capability": e.g. "AVX512", "torch_version"}."""
    import torch

    return {"torch_threads": torch.get_num_threads(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch_version": torch.__version__}
