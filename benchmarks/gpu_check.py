"""Issue 28's whole GPU check in one command: four runs of bench_gpu_grpo.py, each under a time limit, then a
combined JSON and a markdown table. Meant for one lent H100/H200 (docs/gpu.md); `benchmarks/gpu_check.sh`
installs the carried wheels first and calls this.

  1. train-0.5b       qwen2.5-0.5b --train-only, P=64 G=8, 512 completion tokens, micro-batches of 16 sequences:
                      train time, train tokens/s, MFU, peak GPU memory per step
  2. train-0.5b-ckpt  the same with --gradient-checkpointing (MFU also counting the recompute, 8N)
  3. train-7b         qwen2.5-7b --train-only, one step at P*G=64 (P=8 G=8), 256 completion tokens, gradient
                      checkpointing, ZeRO-3, micro-batches of 8; optimizer offload to the CPU only when the trained
                      state (16 bytes/parameter, ~113 GiB) would not fit the GPU (--offload-optimizer auto: on an
                      H100 it is offloaded, on an H200 not)
  4. grpo-0.5b        qwen2.5-0.5b full GRPO (HF rollouts + update), P=64 G=8, 512 new tokens, 2 steps: step time
                      and its split; it writes its JSON after every step, so a run cut by its time limit still
                      reports the steps it finished

The runs share one time budget (--budget, default 330 s): each gets min(its own limit, what is left), and the
full GRPO run comes last because it is the longest and reports partial results. Results: <out>/gpu_check.json
(every run's JSON, status, wall time and output tail) and <out>/gpu_check.md (the table); <out> is --out, else
$OUT, else /tmp/gpu_check.

`--tiny` swaps every shape for the tiny one at CPU sizes (P=4 G=2, 16 tokens, --allow-cpu): a dry run of the
whole driver in about two minutes on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks" / "bench_gpu_grpo.py"

# name, what it measures, its own time limit (s), bench_gpu_grpo.py arguments
RUNS: list[tuple[str, str, int, list[str]]] = [
    ("train-0.5b", "update only, micro-batches of 16", 100,
     ["--shape", "qwen2.5-0.5b", "--train-only", "-P", "64", "-G", "8", "--max-new-tokens", "512", "--steps", "3",
      "--micro-batch-size", "16"]),
    ("train-0.5b-ckpt", "update only, micro-batches of 16, gradient checkpointing", 100,
     ["--shape", "qwen2.5-0.5b", "--train-only", "-P", "64", "-G", "8", "--max-new-tokens", "512", "--steps", "3",
      "--micro-batch-size", "16", "--gradient-checkpointing"]),
    ("train-7b", "update only, one step, ZeRO-3, gradient checkpointing, micro-batches of 8", 170,
     ["--shape", "qwen2.5-7b", "--train-only", "-P", "8", "-G", "8", "--max-new-tokens", "256", "--steps", "1",
      "--zero-stage", "3", "--gradient-checkpointing", "--micro-batch-size", "8", "--offload-optimizer", "auto"]),
    ("grpo-0.5b", "full GRPO step (HF rollouts + update), micro-batches of 16", 180,
     ["--shape", "qwen2.5-0.5b", "-P", "64", "-G", "8", "--max-new-tokens", "512", "--steps", "2",
      "--micro-batch-size", "16"]),
]
TINY = {"--shape": "tiny", "-P": "4", "-G": "2", "--max-new-tokens": "16", "--micro-batch-size": "2"}


def tiny_args(args: list[str]) -> list[str]:
    """The same run at CPU size: every value in TINY replaced, plus --allow-cpu, a nominal peak, one thread."""
    out = list(args)
    for i, x in enumerate(out[:-1]):
        if x in TINY:
            out[i + 1] = TINY[x]
    return out + ["--allow-cpu", "--peak-tflops", "1", "--threads", "1"]


def run_one(name: str, args: list[str], limit: float, work: Path) -> dict[str, Any]:
    """bench_gpu_grpo.py with `args` in its own process group, stopped (the whole group) after `limit` s;
    its result JSON is read even then (the full-GRPO mode writes one after every step)."""
    out_json = work / f"{name}.json"
    cmd = [sys.executable, str(BENCH), *args, "--out", str(out_json)]
    print(f"\n=== {name} (limit {limit:.0f} s): {' '.join(cmd[1:])}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: list[str] = []

    def pump() -> None:  # the child's output, echoed as it comes and kept for the tail
        for line in proc.stdout:
            print(line, end="", flush=True)
            lines.append(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)  # the whole group: verifier workers too
        proc.wait()
    reader.join(timeout=10)
    rc = proc.returncode
    wall = time.perf_counter() - t0
    try:
        result = json.loads(out_json.read_text()) if out_json.exists() else None
    except ValueError:  # cut while writing (the bench writes to a temporary name and renames, so unlikely)
        result = None
    status = "timeout" if timed_out else ("ok" if rc == 0 else f"failed (exit {rc})")
    if timed_out:
        print(f"=== {name}: stopped at its limit ({limit:.0f} s)", flush=True)
    return {"name": name, "status": status, "wall_s": round(wall, 1), "args": args, "result": result,
            "output_tail": "".join(lines[-40:])}


def _f(x: Any, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def table_row(r: dict[str, Any], what: str) -> str:
    """One markdown row; numbers from the run's summary (steps 2.. when there are several)."""
    res = r["result"] or {}
    sm, dev, st = res.get("summary") or {}, res.get("device") or {}, res.get("settings") or {}
    train_only = res.get("mode") == "train_only"
    mem_a = sm.get("max_memory_allocated_gib") if train_only else dev.get("max_memory_allocated_gib")
    step_s = sm.get("mean_t_train_s") if train_only else sm.get("mean_step_s")
    tok_s = sm.get("train_tokens_per_s") if train_only else sm.get("tokens_per_s")
    pct = (lambda x: "–" if x is None else f"{100 * x:.1f}%")
    status = r["status"] + (" (partial)" if res.get("partial") else "")
    return (f"| {r['name']} | {what} | {status} | {_f(step_s, '.2f')} | {_f(tok_s, ',.0f')} | {pct(sm.get('mfu'))} | "
            f"{pct(sm.get('mfu_with_recompute'))} | {_f(mem_a, '.1f')} | {_f(sm.get('max_memory_reserved_gib'), '.1f')} | "
            f"{_f(sm.get('rollout_tokens_per_s'), ',.0f')} | {st.get('offload_optimizer', '–')} | {r['wall_s']} |")


def markdown(runs: list[dict[str, Any]], whats: dict[str, str], header: dict[str, Any]) -> str:
    lines = [f"# GPU check ({header['device']}, {header['when']}{', tiny dry run' if header.get('tiny') else ''})", "",
             "step s: train-only = the update alone (mean of steps 2.., or step 1 when only one); full GRPO = the "
             "whole step. tok/s: train tokens/s (train-only) or generated tokens/s of the whole step (full). MFU: "
             "6N (+2N with a reference) per train token; MFU 8N counts the recompute of gradient checkpointing. "
             "Peak memory: train-only per step (max over steps), full GRPO over the whole run.", "",
             "| run | what | status | step s | tok/s | MFU | MFU 8N | peak alloc GiB | peak reserved GiB | "
             "rollout tok/s | offload | wall s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [table_row(r, whats[r["name"]]) for r in runs]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="results folder (default $OUT, else /tmp/gpu_check)")
    ap.add_argument("--budget", type=float, default=330.0, help="seconds for all runs together")
    ap.add_argument("--tiny", action="store_true", help="tiny shape at CPU sizes: a dry run of the driver")
    ap.add_argument("--only", nargs="*", default=None, help="run only these (names as in the table)")
    a = ap.parse_args(argv)
    out = a.out or Path(os.environ.get("OUT") or "/tmp/gpu_check")
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    t_end = time.perf_counter() + a.budget
    runs, whats = [], {}
    for name, what, limit, args in RUNS:
        if a.only is not None and name not in a.only:
            continue
        whats[name] = what
        args = tiny_args(args) if a.tiny else list(args)
        left = t_end - time.perf_counter()
        if left < 20:
            runs.append({"name": name, "status": "skipped (budget spent)", "wall_s": 0, "args": args, "result": None,
                         "output_tail": ""})
            continue
        runs.append(run_one(name, args, min(limit, left), work))
        write(out, runs, whats, tiny=a.tiny)
    print("\n" + write(out, runs, whats, tiny=a.tiny), flush=True)
    return 0 if all(r["status"] == "ok" for r in runs) else 1


def write(out: Path, runs: list[dict[str, Any]], whats: dict[str, str], *, tiny: bool) -> str:
    """gpu_check.json and gpu_check.md in `out` (rewritten after every run); returns the markdown."""
    dev = next((r["result"]["device"]["name"] for r in runs if (r["result"] or {}).get("device")), "device unknown")
    header = {"device": dev, "when": time.strftime("%Y-%m-%d %H:%M:%S"), "tiny": tiny}
    md = markdown(runs, whats, header)
    (out / "gpu_check.json").write_text(json.dumps({**header, "runs": runs}, indent=2) + "\n")
    (out / "gpu_check.md").write_text(md)
    return md


if __name__ == "__main__":
    sys.exit(main())
