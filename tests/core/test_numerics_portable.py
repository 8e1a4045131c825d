"""With RLVR_CPU_CAPABILITY=avx2 (the default) the demo's base model is the same on any x86-64 with AVX2: rlvr pins torch's (and
MKL's, oneDNN's) kernels to AVX2 (rlvr_core.core.numerics.pin_cpu_kernels). A machine is simulated by `ATEN_CPU_CAPABILITY`; each build is the
demo's warm start, two steps, in its own process (benchmarks/numerics_capability.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _builds(*args: str) -> dict:
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "numerics_capability.py"), "--steps", "2",
                        "--capabilities", "avx2,avx512", *args], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)["builds"]


@pytest.mark.slow
def test_the_base_model_is_the_same_under_avx2_and_avx512():
    if " avx512f" not in Path("/proc/cpuinfo").read_text():
        pytest.skip("this CPU has no AVX-512: both simulated machines would run AVX2 anyway")
    native = _builds("--native")  # torch's own choice, as before the pin: the machines part at once
    assert [b["capability"] for b in native.values()] == ["AVX2", "AVX512"]
    assert native["avx2"]["final_weights"] != native["avx512"]["final_weights"], native
    pinned = _builds()
    assert [b["capability"] for b in pinned.values()] == ["AVX2", "AVX2"], pinned
    assert pinned["avx2"]["final_weights"] == pinned["avx512"]["final_weights"], pinned
    assert pinned["avx512"]["first_divergent_step"] is None
    assert pinned["avx2"]["final_weights"] == native["avx2"]["final_weights"]  # the pin is AVX2's numbers


def test_the_pin_is_the_default_native_opts_out_and_a_typo_is_refused():
    from rlvr_core.core.numerics import CPU_KERNELS, pin_cpu_kernels

    env: dict[str, str] = {}
    assert pin_cpu_kernels(env) == CPU_KERNELS and env["ATEN_CPU_CAPABILITY"] == "avx2"
    env = {"RLVR_CPU_CAPABILITY": "Native"}
    assert pin_cpu_kernels(env) == {} and "ATEN_CPU_CAPABILITY" not in env
    with pytest.raises(ValueError, match="RLVR_CPU_CAPABILITY='avx512'.*avx2.*native"):
        pin_cpu_kernels({"RLVR_CPU_CAPABILITY": "avx512"})


def test_this_process_computes_with_the_pinned_kernels():
    import torch

    if os.environ.get("RLVR_CPU_CAPABILITY", "avx2").lower() == "native":
        pytest.skip("RLVR_CPU_CAPABILITY=native in this environment")
    assert torch.backends.cpu.get_cpu_capability() in ("AVX2", "DEFAULT")
