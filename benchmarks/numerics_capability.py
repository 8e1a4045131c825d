"""Does the demo's base model depend on the CPU's instruction set? Build the tiny base model (the warm start of
configs/demo.yaml, fewer steps with --steps) once per `ATEN_CPU_CAPABILITY` this machine supports, each in its
own process (ATen reads the variable at its first kernel), and compare the weights' hashes, the initial weights
and the loss step by step, so the first step where the builds part is named.

    python benchmarks/numerics_capability.py --steps 30 --native       # torch's own choice: the builds differ
    python benchmarks/numerics_capability.py --steps 30                # RLVR_CPU_CAPABILITY=avx2: equal

A machine's capability is simulated by `ATEN_CPU_CAPABILITY` (torch never goes above what the CPU has).
`--native` sets RLVR_CPU_CAPABILITY=native (torch's own choice); without it each build runs with
RLVR_CPU_CAPABILITY=avx2, rlvr's default pin (rlvr_core.core.numerics), whatever the simulated machine.

`--env K=V` adds a variable to every build (to test a fix: e.g. the MKL or oneDNN instruction-set caps). One
thread per build, as the demo's stage children run (OMP_NUM_THREADS=1, RLVR_STAGE_THREADS). Prints one JSON
object: per capability the hash of the initial and the final weights, the losses, the wall time; and
`first_divergent_step` per capability against the first one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CAPABILITIES = ("default", "avx2", "avx512")


def build(out: Path, steps: int) -> dict:
    """In this process: the demo's warm start for `steps` steps; hashes of the initial and final weights."""
    import hashlib
    import time

    import torch

    from rlvr_core.data.synthetic import SyntheticSpec, make_synthetic_dataset
    from rlvr_core.experiment.config import load_config
    from rlvr_core.pipeline.base_model_stage import warm_start_spec
    from rlvr_core.tiny import warmstart

    torch.set_num_threads(1)
    cfg = load_config(ROOT / "configs" / "demo.yaml")
    s = cfg.data.synthetic
    rows = make_synthetic_dataset(SyntheticSpec(n_train=s.n_train, n_test=s.n_test, seed=s.seed,
                                                difficulty=s.difficulty))["train"]
    spec = warm_start_spec(cfg)
    spec = type(spec)(**{**spec.__dict__, "steps": steps, "progress_every": 1})

    def digest(model) -> str:
        h = hashlib.sha256()
        for name, p in sorted(model.state_dict().items()):
            h.update(name.encode() + p.detach().contiguous().numpy().tobytes())
        return h.hexdigest()[:16]

    initial = {}
    build_model = warmstart.build_tiny_model

    def recording_build(*a, **kw):
        model = build_model(*a, **kw)
        initial["hash"] = digest(model)
        return model

    warmstart.build_tiny_model = recording_build  # the warm start's own builder, observed
    losses: list[float] = []
    t0 = time.perf_counter()
    res = warmstart.train_tiny(rows, spec, template_id=cfg.prompt.template,
                               progress=lambda step, total, loss: losses.append(loss))
    return {"capability": torch.backends.cpu.get_cpu_capability(), "initial_weights": initial["hash"],
            "final_weights": digest(res.model), "losses": losses, "wall_s": round(time.perf_counter() - t0, 1)}


def supported() -> list[str]:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return [c for c in CAPABILITIES if c == "default" or f" {c}" in flags.replace("avx512f", "avx512")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--capabilities", default=",".join(supported()))
    ap.add_argument("--env", action="append", default=[], help="K=V added to every build's environment")
    ap.add_argument("--native", action="store_true", help="RLVR_CPU_CAPABILITY=native: no pinning by rlvr")
    ap.add_argument("--_build", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a._build:
        print(json.dumps(build(a._build, a.steps)))
        return
    results = {}
    extra = dict(kv.split("=", 1) for kv in a.env)
    extra["RLVR_CPU_CAPABILITY"] = "native" if a.native else "avx2"
    for cap in a.capabilities.split(","):
        env = {**os.environ, **extra, "ATEN_CPU_CAPABILITY": cap, "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        with tempfile.TemporaryDirectory() as tmp:
            p = subprocess.run([sys.executable, __file__, "--steps", str(a.steps), "--_build", tmp], env=env,
                               capture_output=True, text=True, check=True)
        results[cap] = json.loads(p.stdout.strip().splitlines()[-1])
    first = next(iter(results.values()))
    for r in results.values():
        r["first_divergent_step"] = next((i + 1 for i, (x, y) in enumerate(zip(r["losses"], first["losses"]))
                                          if x != y), None)
        r["losses"] = [r["losses"][0], r["losses"][-1]]
    print(json.dumps({"steps": a.steps, "env": extra, "builds": results}, indent=1))


if __name__ == "__main__":
    main()
