"""rlvr: an experiment pipeline for reinforcement learning with verifiable rewards.

`rlvr_core` is the library: pure functions and small classes, never Prefect. Its subpackages are layers,
bottom to top: core, artifacts, records, data, verifiers, experiment, sampling + tiny, grpo, eval + probe,
pipeline; a module imports only its own layer and lower ones (tests/core/test_import_contract.py). The
Prefect layer lives in `tasks/` (thin task wrappers) and `flows/` (pipelines composed of tasks); the
`rlvr` command line in `rlvr_cli/`.
"""

__version__ = "0.1.0"

# Before any torch kernel runs in this process (or its children): AVX2 kernels, so the same inputs give the same
# numbers on any x86-64 with AVX2 (RLVR_CPU_CAPABILITY=native opts out; docs/demo.md "Same numbers on any machine").
from rlvr_core.core.numerics import pin_cpu_kernels as _pin_cpu_kernels  # noqa: E402

_pin_cpu_kernels()
