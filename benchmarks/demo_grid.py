"""The demo's RL gain over a grid: training seeds × data seeds × thread counts (docs/demo.md, "Robustness").

Every cell is `rlvr demo --json` itself with `--set seed=S` (the GRPO draws), `--set data.synthetic.seed=D
--set model.warm_start.seed=D` (new problems and a new base model) and OMP_NUM_THREADS=T. Cells of one
(data seed, thread count) share a home, so their data, base model and pass-rate table are built once (the
stage caches; the thread count is part of those caches' keys). Runs at one thread go two at a time (one
per data seed: the 2 cores are used either way); runs at two threads go one at a time.

    python benchmarks/demo_grid.py --out docs/benchmarks/demo_grid.json [--seeds 0 1 2] [--data-seeds 0 1]
        [--threads 1 2] [--set KEY=VALUE ...]

Prints one row per cell (base → trained greedy accuracy, the paired Δ with its 95 % interval, n, flow
seconds) and the distribution of the paired Δ (min, median, max); writes every cell's summary to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def run_cell(home: Path, seed: int, data_seed: int, threads: int, extra: list[str]) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PREFECT_", "RLVR_"))}
    env.update(RLVR_HOME=str(home), OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    cmd = [sys.executable, "-m", "rlvr_cli.main", "demo", "--json", "--quiet", "--set", f"seed={seed}",
           "--set", f"data.synthetic.seed={data_seed}", "--set", f"model.warm_start.seed={data_seed}"]
    for kv in extra:
        cmd += ["--set", kv]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"cell seed={seed} data={data_seed} threads={threads} failed:\n{p.stderr[-3000:]}")
    s = json.loads(p.stdout.strip().splitlines()[-1])
    d = s["comparison"]["accuracy_greedy"]
    return {"seed": seed, "data_seed": data_seed, "threads": threads, "base": s["base_pass_at_1"],
            "trained": s["trained_pass_at_1"], "delta": d["delta"], "ci_low": d["ci_low"], "ci_high": d["ci_high"],
            "mcnemar_p": d.get("mcnemar_p"), "n": d["n"],
            "base_pass_at_1_sampled": s["base_pass_at_k"].get("1"),
            "trained_pass_at_1_sampled": (s.get("trained_pass_at_k") or {}).get("1"),
            "flow_s": round(s["duration_s"], 1), "wall_s": round(time.perf_counter() - t0, 1),
            "cached": s["cached"], "numerics": s.get("numerics")}


def _row(c: dict) -> str:
    return (f"| {c['data_seed']} | {c['threads']} | {c['seed']} | {c['base']:.3f} → {c['trained']:.3f} | "
            f"**{100 * c['delta']:+.1f}** [{100 * c['ci_low']:+.1f}, {100 * c['ci_high']:+.1f}] | {c['n']} | {c['flow_s']:.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--homes", type=Path, default=Path("/tmp/rlvr-demo-grid"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--data-seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="passed to every cell")
    a = ap.parse_args()
    cells: list[dict] = []  # every finished cell, in finishing order; --out is rewritten after each
    a.out.parent.mkdir(parents=True, exist_ok=True)

    def lane(data_seed: int, threads: int) -> None:
        home = a.homes / f"data{data_seed}-threads{threads}"
        for seed in a.seeds:
            c = run_cell(home, seed, data_seed, threads, a.set)
            print(_row(c), flush=True)
            cells.append(c)
            a.out.write_text(json.dumps({"set": a.set, "cells": cells}, indent=2) + "\n")

    print("| data seed | threads | seed | greedy base → trained | paired Δ (95% CI) | n | flow s |\n|---|---|---|---|---|---|---|",
          flush=True)
    for threads in a.threads:
        # Lanes at one thread run side by side (one per data seed); at more threads one after another.
        parallel = max(1, (os.cpu_count() or 2) // threads)
        with ThreadPoolExecutor(parallel) as ex:
            list(ex.map(lambda d: lane(d, threads), a.data_seeds))  # list(): re-raises a failed cell
    deltas = sorted(c["delta"] for c in cells)
    worst = min(cells, key=lambda c: c["delta"])
    print(f"\npaired Δ over {len(cells)} cells: min {100 * deltas[0]:+.1f}, median {100 * statistics.median(deltas):+.1f}, "
          f"max {100 * deltas[-1]:+.1f}; lowest interval bound {100 * min(c['ci_low'] for c in cells):+.1f} "
          f"(worst cell: data seed {worst['data_seed']}, threads {worst['threads']}, seed {worst['seed']})")


if __name__ == "__main__":
    main()
