"""Bounded staleness: our trainer on-policy (max_staleness 0) vs sampling one step ahead (max_staleness 1).

Why: with max_staleness s > 0 a background thread generates the next steps' rollouts while the trainer
trains (rlvr_core/grpo/ahead.py). This measures what that overlap buys on the demo's tiny model: the same
trainer, model, prompts, batch and settings, once on-policy and once with staleness S, each in its own
child process (bench_grpo_vs_trl.py's `ours` child, which reads the trainer's own step timers), alternated
`--rounds` times. The step time is t_rollout_s + t_reward_s + t_train_s; with staleness, t_rollout_s is
the trainer's wait for a batch the thread was generating meanwhile, and the weight snapshot it publishes
after each update is in t_train_s. The reward column shows the runs learn alike over these few steps
(they do not sample the same completions after step 1: step t of the stale run samples older weights).

Run (from the repository root):

    .venv/bin/python benchmarks/bench_staleness.py --threads 2 --rounds 2     # 2 warm-up + 10 steps each
    .venv/bin/python benchmarks/bench_staleness.py --steps 3 --warmup-steps 1  # smoke
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_grpo_vs_trl as peer  # noqa: E402  (its `ours` child, step summary and base-model builder)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="/tmp/bench-base", help="demo base model dir (built if missing)")
    ap.add_argument("--steps", type=int, default=10, help="measured steps per run")
    ap.add_argument("--warmup-steps", type=int, default=2, help="steps run first and dropped")
    ap.add_argument("--threads", type=int, default=2, help="torch threads in each child")
    ap.add_argument("--rounds", type=int, default=1, help="alternate the two runs this many times")
    ap.add_argument("--staleness", type=int, default=1, help="max_staleness of the second run")
    a = ap.parse_args()
    a.only = "ours"
    runs = {}
    work = Path(tempfile.mkdtemp(prefix="bench-stale-"))
    peer._ensure_base(argparse.Namespace(base=a.base, threads=a.threads))
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    for rnd in range(a.rounds):
        for s in (0, a.staleness):
            child = argparse.Namespace(threads=a.threads, passthrough=[
                "--base", a.base, "--steps", str(a.steps), "--warmup-steps", str(a.warmup_steps),
                "--threads", str(a.threads), "--our-max-staleness", str(s)])
            res = peer._child(child, "ours", work / f"s{s}_round{rnd}")
            runs.setdefault(s, []).extend(st for st in res["steps"] if st["step"] > a.warmup_steps)
    summ = {s: peer._summarise(steps) for s, steps in runs.items()}
    on, st = summ[0], summ[a.staleness]
    print(f"\nthreads={a.threads} rounds={a.rounds}, {a.warmup_steps} warm-up + {a.steps} measured steps per run; "
          f"loadavg(1m) {load0:.2f} before, {os.getloadavg()[0]:.2f} after; wall {time.perf_counter() - t0:.0f}s")
    print(f"| metric (per-step median) | on-policy (s=0) | s={a.staleness} | s={a.staleness} / s=0 |")
    print("|---|---|---|---|")
    for label, key in (("step time (s)", "step_s"), ("rollout wait (s)", "rollout_s"), ("reward (s)", "reward_s"),
                       ("train (s)", "train_s"), ("generated tokens / step", "gen_tokens"),
                       ("tokens/s (generated / step time)", "tok_per_s"), ("mean reward", "reward_mean")):
        ratio = f"{st[key] / on[key]:.2f}" if on[key] else "–"
        print(f"| {label} | {on[key]:.4g} | {st[key]:.4g} | {ratio} |")
    print(f"steps measured: {len(runs[0])} and {len(runs[a.staleness])}; "
          f"mean step time {statistics.mean(x['step_s'] for x in runs[0]):.3f}s vs "
          f"{statistics.mean(x['step_s'] for x in runs[a.staleness]):.3f}s")


if __name__ == "__main__":
    main()
