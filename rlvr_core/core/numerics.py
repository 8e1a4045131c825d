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

import os

__all__ = ["numerics", "pin_cpu_kernels", "CPU_KERNELS"]

# The instruction set an rlvr process computes with when RLVR_CPU_CAPABILITY=avx2: the same inputs then give the
# same numbers on any x86-64 with AVX2 (docs/demo.md, "Same numbers on any machine"). Measured
# (benchmarks/numerics_capability.py): ATen's vectorized kernels round differently at each width, so the warm
# start's weights under AVX-512 and AVX2 part at its second step, and torch's CPU `normal_` fills the initial
# weights differently without vectorization (DEFAULT) than with it. The default (`native`) leaves the choice to
# torch, the numbers are the machine's and recorded as such: pinned by default, the tool demo's warm start
# (configs/examples/tool-demo.yaml) learned too little copying on this AVX-512 machine to train (docs/demo.md).
CPU_KERNELS = {
    "ATEN_CPU_CAPABILITY": "avx2",  # torch's own kernels (a CPU without AVX2 runs DEFAULT: ATen never goes above it)
    "MKL_CBWR": "AVX2",  # MKL's conditional numerical reproducibility: its AVX2 code path on every CPU model
    "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN (mkldnn) kernels, likewise
}


def pin_cpu_kernels(environ: dict | None = None) -> dict[str, str]:
    """Set `CPU_KERNELS` in `environ` (this process's environment by default) when RLVR_CPU_CAPABILITY is `avx2`
    (the default, `native`, sets nothing); returns what was set. Takes effect when it runs before torch's first kernel (torch reads these
    variables then, not at import): `rlvr_core/__init__.py` calls it, and child processes inherit it."""
    env = os.environ if environ is None else environ
    if env.get("RLVR_CPU_CAPABILITY", "native").lower() != "avx2":
        return {}
    env.update(CPU_KERNELS)
    return dict(CPU_KERNELS)


def numerics() -> dict[str, object]:
    """{"torch_threads": intra-op threads now, "cpu_capability": the kernels torch runs, e.g. "AVX512" (the
    machine's own, the default) or "AVX2" (RLVR_CPU_CAPABILITY=avx2, `pin_cpu_kernels`), "torch_version"}."""
    import torch

    return {"torch_threads": torch.get_num_threads(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch_version": torch.__version__}
