"""GRPO through `vllm serve` (`engine="vllm-server"`) at staleness 0 and 1 vs the in-process `vllm` engine.

Why: the server engine separates generation from training (its own processes, on a cluster its own GPUs) and,
with `max_staleness` 1, lets the servers generate step t + 1 while the trainer trains step t. This measures, in
one run on the demo's base model: GRPO generated tokens per second of step time for each arm, and the weight push
per step (`t_weight_push_s`: on-policy the push before the rollout; with staleness the push happens in the ahead
thread, overlapping training, and the column is 0). Arms, each a child process running the same trainer, model,
prompts and settings (bench_grpo_vs_trl.py's `ours` settings), one after the other, alternated `--rounds` times:
  vllm          the in-process engine (one per trainer process; weights pushed in place before every rollout)
  server-s0     vllm-server, max_staleness 0 (push, then generate, then train)
  server-s1     vllm-server, max_staleness 1 (the ahead thread pushes version t - 1 and generates step t)
One server (`launch_servers`, `--server-threads` CPU threads) is started first and shared by the server arms; its
start-up time is printed, not counted in the steps. On a CPU the server and the trainer share the machine's cores
(`--threads` for the trainer); on a GPU node each gets its own devices (docs/gpu.md has the GPU command).

Run (from the repository root):
    .venv/bin/python benchmarks/bench_vllm_server.py --json /tmp/bench_vllm_server.json
    .venv/bin/python benchmarks/bench_vllm_server.py --steps 2 --warmup-steps 1   # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_grpo_vs_trl as peer  # noqa: E402  (base-model builder, rows, step summary)

SERVER_ARMS = ("server-s0", "server-s1")


def run_child(a: argparse.Namespace) -> dict:
    """One arm: train warmup + steps GRPO steps, return per-step rows in bench_grpo_vs_trl's form."""
    peer._set_threads(a.threads)
    import pyarrow.parquet as pq

    from rlvr_core.experiment.config import GRPOConfig, RewardConfig
    from rlvr_core.grpo.trainer import train_grpo

    rows = peer._load_rows()
    cfg = GRPOConfig(enabled=True, steps=a.warmup_steps + a.steps, prompts_per_step=a.prompts_per_step,
                     group_size=a.group_size, temperature=1.0, top_p=1.0, lr=5e-5, beta=0.0, loss_agg="token-mean",
                     precision=a.precision, zero_stage=2, max_staleness=1 if a.child.startswith("server-s1") else 0,
                     checkpoint_every=10**6, eval_every=0)
    engine, options = (("vllm", None) if a.child == "vllm" else
                       ("vllm-server", {"servers": [a.server], "push": {"type": a.push_backend}}))
    res = train_grpo(a.base, rows, [r["id"] for r in rows], Path(a.child_work), cfg, template_id="qa",
                     reward=RewardConfig(verifier="gsm8k"), max_new_tokens=a.max_new_tokens, seed=0,
                     engine=engine, engine_options=options)
    steps = []
    for r in pq.read_table(res.steps_path).to_pylist():
        gen = int(round(r["completion_len_mean"] * a.prompts_per_step * a.group_size))
        step_s = r["t_rollout_s"] + r["t_reward_s"] + r["t_train_s"]
        steps.append({"step": int(r["step"]), "step_s": step_s, "rollout_s": r["t_rollout_s"],
                      "reward_s": r["t_reward_s"], "train_s": r["t_train_s"], "gen_tokens": gen,
                      "train_tokens": gen, "push_s": r["t_weight_push_s"], "reward_mean": r["reward_mean"],
                      "completion_len_mean": r["completion_len_mean"], "truncation_share": r["truncation_share"],
                      "staleness": r.get("staleness", 0), "version": r.get("weight_version/min")})
    return {"arm": a.child, "steps": steps}


def _spawn(a: argparse.Namespace, arm: str, work: Path, server: str, backend: str = "file") -> dict:
    work.mkdir(parents=True, exist_ok=True)
    out = work / f"{arm}.json"
    env = {k: v for k, v in os.environ.items() if k not in peer.DIST_VARS}
    env.update(OMP_NUM_THREADS=str(a.threads), TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, __file__, "--child", arm, "--child-out", str(out), "--child-work", str(work / arm),
           "--server", server, "--push-backend", backend, "--precision", a.precision, "--base", a.base, "--steps", str(a.steps), "--warmup-steps", str(a.warmup_steps),
           "--threads", str(a.threads), "--prompts-per-step", str(a.prompts_per_step),
           "--group-size", str(a.group_size), "--max-new-tokens", str(a.max_new_tokens)]
    with open(work / f"{arm}.log", "w") as log:
        proc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"arm {arm} failed (exit {proc.returncode}); log {work / f'{arm}.log'}:\n"
                         + (work / f"{arm}.log").read_text()[-3000:])
    return json.loads(out.read_text())


def _table(summ: dict[str, dict], push: dict[str, float]) -> str:
    lines = ["| metric (per-step median) | " + " | ".join(summ) + " |", "|---|" + "---|" * len(summ)]
    for label, key, fmt in (("step time (s)", "step_s", ".3f"), ("rollout / wait (s)", "rollout_s", ".3f"),
                            ("train (s)", "train_s", ".3f"), ("generated tokens / step", "gen_tokens", ".0f"),
                            ("tokens/s (generated / step time)", "tok_per_s", ".1f"),
                            ("mean reward", "reward_mean", ".3f")):
        lines.append(f"| {label} | " + " | ".join(format(s[key], fmt) for s in summ.values()) + " |")
    lines.append("| weight push per step (s) | " + " | ".join(f"{push[k]:.4f}" for k in summ) + " |")
    base = summ["vllm"]["tok_per_s"]
    lines.append("| tokens/s ÷ in-process vllm | " + " | ".join(f"{s['tok_per_s'] / base:.2f}" for s in summ.values())
                 + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="/tmp/bench-base", help="demo base model dir (built if missing)")
    ap.add_argument("--steps", type=int, default=8, help="measured steps per arm (per round)")
    ap.add_argument("--warmup-steps", type=int, default=2, help="steps run first and dropped")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the trainer")
    ap.add_argument("--server-threads", type=int, default=1, help="CPU threads of the vllm serve process")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--prompts-per-step", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"], help="trainer and engines")
    ap.add_argument("--push-backends", default="file", help="comma-separated: file, gloo (CPU or GPU), ipc, nccl "
                    "(CUDA; nccl needs the servers on another GPU: CUDA_VISIBLE_DEVICES); one "
                    "server per backend, each used by both server arms")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--push-backend", default="file", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-work", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--server", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        Path(a.child_out).write_text(json.dumps(run_child(a)))
        return
    from rlvr_core.sampling.vllm_server_launch import launch_servers

    peer._ensure_base(argparse.Namespace(base=a.base, threads=a.threads))
    work = Path(tempfile.mkdtemp(prefix="bench-vllm-server-"))
    backends = a.push_backends.split(",")
    runs: dict[str, list[dict]] = {"vllm": []}
    load0 = os.getloadavg()[0]
    dtype = "bfloat16" if a.precision == "bf16" else "float32"
    for backend in backends:
        t0 = time.perf_counter()
        server, = launch_servers(a.base, 1, work / f"server-{backend}", threads=a.server_threads,
                                 start_timeout_s=900, push=backend, dtype=dtype)
        print(f"server {server.url} ({backend}) healthy after {time.perf_counter() - t0:.1f}s", flush=True)
        try:
            for rnd in range(a.rounds):
                arms = (["vllm"] if backend == backends[0] else []) + list(SERVER_ARMS)
                for arm in arms:
                    name = arm if arm == "vllm" else f"{arm} {backend}"
                    res = _spawn(a, arm, work / f"{backend}-round{rnd}", server.url, backend)
                    runs.setdefault(name, []).extend(s for s in res["steps"] if s["step"] > a.warmup_steps)
        finally:
            server.stop()
    summ = {arm: peer._summarise(steps) for arm, steps in runs.items()}
    push = {arm: statistics.median(s["push_s"] for s in steps) for arm, steps in runs.items()}
    print(f"\n{a.warmup_steps} warm-up + {a.steps} measured steps x {a.rounds} round(s); P={a.prompts_per_step} "
          f"G={a.group_size} max_new_tokens={a.max_new_tokens}; trainer threads {a.threads}, server threads "
          f"{a.server_threads}; loadavg(1m) {load0:.2f} before, {os.getloadavg()[0]:.2f} after")
    print(_table(summ, push))
    for name in (n for n in runs if n.startswith("server-s1")):
        print(f"{name} (step, weight version): {[(s['step'], s['version']) for s in runs[name]]}")
    if a.json:
        a.json.write_text(json.dumps({"runs": runs, "summary": summ, "push_s": push}, indent=1))


if __name__ == "__main__":
    main()
