"""Rollout traces' cost: the demo's GRPO step time with MLflow traces on vs off.

Why: issue 43's bar is "step time with traces on within 3 % of off, measured on the demo". Each arm is the
demo's GRPO recipe (configs/demo.yaml: 16 prompts x 8 rollouts, T 1.0, beta 0.1, DAPO dynamic sampling, 48
new tokens) on the demo's base model, in its own child process, alternated `--rounds` times:

  off  `train_grpo` without a trace sink (what tracking.traces.enabled: false gives)
  on   `train_grpo(on_rollouts=TraceSink(...))` writing to a real MLflow sqlite store, traced *every* step
       (`--every 1`; the default policy traces only the evaluation steps, ~1 in 40 on the demo) with
       `--groups` groups per step (default 4, the default of tracking.traces.groups_per_step)

Per measured step: step_s = t_rollout_s + t_reward_s + t_train_s (the trainer's own timers, steps.parquet),
and, in the `on` arm, hook_ms: the time the training thread spent inside the sink (copying the groups; the
traces are built and written by the sink's own thread, which competes for the same cores and shows up in
step_s). The table gives per-step medians and on / off.

Run (from the repository root):

    .venv/bin/python benchmarks/bench_traces.py --threads 2 --rounds 2          # 2 warm-up + 10 steps per run
    .venv/bin/python benchmarks/bench_traces.py --steps 1 --warmup-steps 0 --prompts-per-step 2 --group-size 2  # smoke
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
import bench_grpo_vs_trl as peer  # noqa: E402  (the demo base-model builder)


def child(a: argparse.Namespace) -> None:
    """One arm: train, and write its per-step times (and, `on`, the traces written) to --child-out."""
    import pyarrow.parquet as pq
    import torch

    from rlvr_core.experiment.config import DEMO_SETTINGS, GRPOConfig, RewardConfig, TracesConfig
    from rlvr_core.grpo.trainer import train_grpo

    torch.set_num_threads(a.threads)
    work = Path(a.child_work)
    rows = peer._load_rows()
    grpo = {**DEMO_SETTINGS["grpo"], "steps": a.warmup_steps + a.steps, "eval_every": 0, "checkpoint_every": 10**6,
            "prompts_per_step": a.prompts_per_step, "group_size": a.group_size}
    cfg = GRPOConfig(**grpo)
    hook_s: list[float] = []
    sink = None
    if a.child == "on":
        from mlflow.tracking import MlflowClient

        from rlvr_core.pipeline.traces import TraceSink

        uri = f"sqlite:///{work / 'mlflow.db'}"
        client = MlflowClient(uri)
        exp = client.create_experiment("bench-traces", artifact_location=str(work / "mlflow-artifacts"))
        run_id = client.create_run(exp).info.run_id
        sink = TraceSink(run_id, uri, TracesConfig(every=a.every, groups_per_step=a.groups),
                         last_step=cfg.steps, eval_interval=0)

        def on_rollouts(row, rollouts):
            t = time.perf_counter()
            sink(row, rollouts)
            hook_s.append(time.perf_counter() - t)
    cpu0 = time.process_time()
    res = train_grpo(a.base, rows, [r["id"] for r in rows], work / "train", cfg, template_id="qa",
                     reward=RewardConfig(verifier="gsm8k"), max_new_tokens=a.max_new_tokens, seed=0,
                     on_rollouts=on_rollouts if sink else None)
    cpu_s = time.process_time() - cpu0  # the training process's CPU time, every thread (the sink's too)
    rows = pq.read_table(res.steps_path).to_pylist()
    out = {"steps": [{"step": r["step"], "step_s": r["t_rollout_s"] + r["t_reward_s"] + r["t_train_s"],
                      "hook_ms": 1000 * hook_s[i] if hook_s else 0.0} for i, r in enumerate(rows)],
           "expected": _expected_traces(rows, a, cfg.steps), "cpu_s": cpu_s}
    if sink is not None:
        t = time.perf_counter()
        sink.close()
        traces = client.search_traces(locations=[exp], run_id=run_id, max_results=10_000, include_spans=False)
        out.update(drain_s=time.perf_counter() - t, traces=len(traces), sent=sink.sent, dropped=sink.dropped,
                   sink_cpu_s=sink.cpu_s)
    Path(a.child_out).write_text(json.dumps(out))


def _expected_traces(rows: list[dict], a: argparse.Namespace, last_step: int) -> int:
    """Traces the policy asks for: on a traced step its first --groups trained groups, on a step a guard flagged
    every group it trained (`tracking.traces.flagged`)."""
    from rlvr_core.experiment.config import TracesConfig
    from rlvr_core.pipeline.traces import fresh_flags, traced_reason

    policy, n, last_traced = TracesConfig(every=a.every, groups_per_step=a.groups), 0, {}
    for r in rows:
        flagged = fresh_flags(last_traced, int(r["step"]), [k for k, v in r.items() if k.startswith("health/") and v],
                              policy)
        reason = traced_reason(policy, int(r["step"]), last_step, 0, flagged)
        kept = int(r["dynamic/groups_kept"])
        n += 0 if reason is None else kept if reason == "flagged" else min(kept, a.groups)
    return n


def run_arm(a: argparse.Namespace, arm: str, work: Path) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in peer.DIST_VARS}
    env.update(OMP_NUM_THREADS=str(a.threads), TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    cmd = [sys.executable, __file__, "--child", arm, "--child-out", str(work / "out.json"), "--child-work", str(work),
           "--base", a.base, "--threads", str(a.threads), "--steps", str(a.steps), "--warmup-steps",
           str(a.warmup_steps), "--prompts-per-step", str(a.prompts_per_step), "--group-size", str(a.group_size),
           "--max-new-tokens", str(a.max_new_tokens), "--every", str(a.every), "--groups", str(a.groups)]
    with open(work / "child.log", "w") as log:
        subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
    return json.loads((work / "out.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="/tmp/bench-base", help="demo base model dir (built if missing)")
    ap.add_argument("--steps", type=int, default=10, help="measured steps per run")
    ap.add_argument("--warmup-steps", type=int, default=2, help="steps run first and dropped")
    ap.add_argument("--threads", type=int, default=2, help="torch threads in each child")
    ap.add_argument("--rounds", type=int, default=1, help="alternate the two arms this many times")
    ap.add_argument("--prompts-per-step", type=int, default=16, help="P (the demo's)")
    ap.add_argument("--group-size", type=int, default=8, help="G (the demo's)")
    ap.add_argument("--max-new-tokens", type=int, default=48, help="the demo's")
    ap.add_argument("--every", type=int, default=1, help="trace every N steps (tracking.traces.every)")
    ap.add_argument("--groups", type=int, default=4, help="groups traced per step (tracking.traces.groups_per_step)")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--child", choices=["on", "off"], help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    ap.add_argument("--child-work", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a)
    peer._ensure_base(argparse.Namespace(base=a.base, threads=a.threads, smoke_base=False))
    work = Path(tempfile.mkdtemp(prefix="bench-traces-"))
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    for rnd in range(a.rounds):
        for arm in ("off", "on"):
            res = run_arm(a, arm, work / f"{arm}{rnd}")
            runs[arm].append(res)
            print(f"round {rnd + 1} {arm}: median step {statistics.median(s['step_s'] for s in res['steps']):.3f}s"
                  + (f", {res['traces']} traces ({res['dropped']} dropped), drain {res['drain_s']:.2f}s"
                     if arm == "on" else ""), flush=True)
    measured = {arm: [s["step_s"] for r in rs for s in r["steps"] if s["step"] > a.warmup_steps]
                for arm, rs in runs.items()}
    med = {arm: statistics.median(v) for arm, v in measured.items()}
    mean = {arm: statistics.fmean(v) for arm, v in measured.items()}
    hook = statistics.median(s["hook_ms"] for r in runs["on"] for s in r["steps"] if s["step"] > a.warmup_steps)
    traces = sum(r["traces"] for r in runs["on"])
    expected = sum(r["expected"] for r in runs["on"])
    sink_share = sum(r["sink_cpu_s"] for r in runs["on"]) / sum(r["cpu_s"] for r in runs["on"])
    print(f"\nthreads={a.threads} rounds={a.rounds}, P={a.prompts_per_step} G={a.group_size}, {a.warmup_steps} "
          f"warm-up + {a.steps} measured steps per run, {a.groups} groups traced every {a.every} step(s) "
          f"(and every group of a flagged step); loadavg(1m) {load0:.2f} before, {os.getloadavg()[0]:.2f} after; "
          f"wall {time.perf_counter() - t0:.0f}s")
    print("| per step | traces off | traces on | on / off |")
    print("|---|---|---|---|")
    print(f"| step time, median (s) | {med['off']:.3f} | {med['on']:.3f} | {med['on'] / med['off']:.3f} |")
    print(f"| step time, mean (s) | {mean['off']:.3f} | {mean['on']:.3f} | {mean['on'] / mean['off']:.3f} |")
    print(f"| time in the trace hook (ms) | - | {hook:.2f} | {hook / 1000 / med['off']:.4f} of a step |")
    print(f"| the sink thread's CPU time, share of the run's | - | {100 * sink_share:.2f} % | |")
    print(f"| traces written | 0 | {traces} (expected {expected}) | |")
    if a.json:
        Path(a.json).write_text(json.dumps({"median_step_s": med, "mean_step_s": mean, "hook_ms": hook,
                                             "sink_cpu_share": sink_share, "traces": traces,
                                             "expected": expected, "runs": runs}))

if __name__ == "__main__":
    main()
