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

# The instruction set an rlvr process computes with (unless RLVR_CPU_CAPABILITY=native): the same inputs then give
# the same numbers on any x86-64 with AVX2 (docs/demo.md, "Same numbers on any machine"). Measured
# (benchmarks/numerics_capability.py): ATen's vectorized kernels round differently at each width, so the warm
# start's weights under AVX-512 and AVX2 part at its second step, and torch's CPU `normal_` fills the initial
# weights differently without vectorization (DEFAULT) than with it. The cost on an AVX-512 machine: ×1.09 on the
# warm start. `native` leaves the choice to torch: the numbers are then the machine's, recorded as such.
CPU_KERNELS = {
    "ATEN_CPU_CAPABILITY": "avx2",  # torch's own kernels (a CPU without AVX2 runs DEFAULT: ATen never goes above it)
    "MKL_CBWR": "AVX2",  # MKL's conditional numerical reproducibility: its AVX2 code path on every CPU model
    "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN (mkldnn) kernels, likewise
}


def pin_cpu_kernels(environ: dict | None = None) -> dict[str, str]:
    """Set `CPU_KERNELS` in `environ` (this process's environment by default) unless RLVR_CPU_CAPABILITY is
    `native` (the default is `avx2`); returns what was set. Takes effect when it runs before torch's first kernel
    (torch reads these variables then, not at import): `rlvr_core/__init__.py` calls it, and child processes
    inherit it. Another value is an error naming the variable."""
    env = os.environ if environ is None else environ
    choice = env.get("RLVR_CPU_CAPABILITY", "avx2").strip().lower()
    if choice not in ("avx2", "native"):
        raise ValueError(f"RLVR_CPU_CAPABILITY={env['RLVR_CPU_CAPABILITY']!r}: use avx2 (the default: the same "
                         f"numbers on any x86-64 with AVX2) or native (the machine's own kernels)")
    if choice == "native":
        return {}
    env.update(CPU_KERNELS)
    return dict(CPU_KERNELS)


def numerics() -> dict[str, object]:
    """{"torch_threads": intra-op threads now, "cpu_capability": the kernels torch runs: "AVX2" (the default,
    `pin_cpu_kernels`; "DEFAULT" on a CPU without AVX2) or the machine's own with RLVR_CPU_CAPABILITY=native,
    "torch_version"}."""
    import torch

    return {"torch_threads": torch.get_num_threads(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch_version": torch.__version__}
