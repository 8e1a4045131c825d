"""A small, fully known set of run folders for the dashboard and report tests.

Experiment `ablate`: two learning rates x three seeds = six GRPO trials. Every trial has a base and a
trained evaluation on two benchmarks (greedy + 4 samples per problem), 30 training steps, rollouts, a
pass@k curve and an exported checkpoint; trial `lr3e-5-s2` collapses (a serious G-collapse firing and
the `collapsed` tag); trial `lr1e-5-s0` carries probe tables
(three checkpoints against the base, as rlvr_core.probe writes them). Everything is drawn from a seeded RNG and
kept in `SampleRuns.truth`, so tests compute what each query should return from the raw values, not
from SQL.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from rlvr_core.artifacts.storage import ArtifactStore, join
from rlvr_core.records import warehouse
from rlvr_core.records.runrecord import upload_run_folder, write_run_folder

EXPERIMENT = "ablate"
LRS = ("1e-5", "3e-5")
SEEDS = (0, 1, 2)
BENCHMARKS = ("gsm8k-mini", "synthetic")
N_PROBLEMS = 12
N_SAMPLES = 4
STEPS = 30
COLLAPSED = "lr3e-5-s2"
PROBED = "lr1e-5-s0"
SWEEP = "lr-x-seed-0001"


@dataclass
class SampleRuns:
    store: ArtifactStore
    run_ids: list[str]
    # truth[run_id] = {"params", "greedy": {(bench, ckpt, pid): bool}, "sampled": {(bench, ckpt, pid): [bool]},
    #                  "accuracy": {(bench, ckpt): float}, "steps": [{...}], "firings": [...], "probe_tokens": [...]}
    truth: dict[str, dict[str, Any]] = field(default_factory=dict)


def _run_id(lr: str, seed: int) -> str:
    return f"lr{lr}-s{seed}"


def build(store: ArtifactStore, tmp: Path) -> SampleRuns:
    out = SampleRuns(store, [])
    for lr in LRS:
        for seed in SEEDS:
            run_id = _run_id(lr, seed)
            out.run_ids.append(run_id)
            out.truth[run_id] = _write_run(store, tmp / run_id, run_id, lr, seed)
    return out


def _write_run(store: ArtifactStore, local: Path, run_id: str, lr: str, seed: int) -> dict[str, Any]:
    rng = random.Random(f"{run_id}")
    skill = {"base": 0.3, "trained": 0.45 if lr == "1e-5" else 0.55}
    greedy, sampled, accuracy = {}, {}, {}
    sample_rows, metric_rows, curve_rows = [], [], []
    for bench in BENCHMARKS:
        for ckpt in ("base", "trained"):
            for i in range(N_PROBLEMS):
                pid = f"{bench}-{i:03d}"
                p = min(0.95, max(0.05, skill[ckpt] + 0.04 * (i % 5 - 2) + rng.uniform(-0.15, 0.15)))
                g = rng.random() < p
                s = [rng.random() < p for _ in range(N_SAMPLES)]
                greedy[(bench, ckpt, pid)], sampled[(bench, ckpt, pid)] = g, s
                common = {"eval_id": ckpt, "benchmark": bench, "benchmark_version": "1", "checkpoint": ckpt,
                          "problem_id": pid, "prompt_template": "chat_plain", "max_new_tokens": 64,
                          "dtype": "float32", "verifier": "gsm8k", "verifier_version": "1"}
                sample_rows.append({**common, "sample_index": 0, "greedy": True, "response": f"#### {i}",
                                    "extracted": str(i), "status": "correct" if g else "incorrect",
                                    "reward": float(g), "finish_reason": "stop", "length": 10 + i,
                                    "temperature": 0.0})
                for j, ok in enumerate(s):
                    sample_rows.append({**common, "sample_index": j, "greedy": False, "response": f"... #### {j}",
                                        "extracted": str(j), "status": "correct" if ok else "incorrect",
                                        "reward": float(ok), "finish_reason": "stop", "length": 20 + j,
                                        "temperature": 1.0})
            acc = sum(greedy[(bench, ckpt, f"{bench}-{i:03d}")] for i in range(N_PROBLEMS)) / N_PROBLEMS
            accuracy[(bench, ckpt)] = acc
            half = 1.96 * math.sqrt(acc * (1 - acc) / N_PROBLEMS)
            metric_rows.append({"eval_id": ckpt, "benchmark": bench, "checkpoint": ckpt, "metric": "accuracy_greedy",
                                "value": acc, "n": N_PROBLEMS, "ci_low": max(0.0, acc - half),
                                "ci_high": min(1.0, acc + half), "settings": "{}"})
            if bench == "synthetic":
                for k in (1, 2, 4):
                    v = sum(1 - math.comb(N_SAMPLES - sum(s), k) / math.comb(N_SAMPLES, k)
                            for key, s in sampled.items() if key[0] == bench and key[1] == ckpt) / N_PROBLEMS
                    curve_rows.append({"source": f"eval/{ckpt}", "k": k, "value": v, "n_problems": N_PROBLEMS})
    collapsed = run_id == COLLAPSED
    steps, firings, rollouts = [], [], []
    for step in range(1, STEPS + 1):
        late = collapsed and step >= 20
        steps.append({"step": step, "reward_mean": 0.3 + 0.01 * step + rng.uniform(-0.02, 0.02) - (0.4 if late else 0),
                      "loss": 0.1 * math.exp(-step / 10) + rng.uniform(0, 0.01),
                      "entropy": (0.1 if late else 1.2 - 0.01 * step) + rng.uniform(0, 0.02),
                      "kl_ref_mean": 0.001 * step * (20 if late else 1), "grad_norm": 1.0 + (30 if late else 0),
                      "health/G-verifier-format": 0, "health/G-collapse": int(collapsed and step == 22)})
        for j in range(2):
            rollouts.append({"step": step, "position": step * 2 + j, "prompt_id": f"train-{(step * 2 + j) % 40:03d}",
                             "sample_index": j, "prompt": "Q?", "completion": f"#### {j}", "reward": float(j),
                             "status": "correct" if j else "incorrect", "length": 12, "finish_reason": "stop",
                             "overlong_penalty": 0.0, "advantage": 0.5 - j})
    firings.append({"guard_id": "G-entropy", "step": 12, "serious": False,
                    "reason": "entropy median 0.9 below 0.8 x baseline", "evidence": {"median": 0.9}, "key": "kl"})
    if collapsed:
        firings.append({"guard_id": "G-collapse", "step": 22, "serious": True,
                        "reason": "3 of 4 collapse signals over steps 18-22", "evidence": {"signals": 3}, "key": ""})
    steps_long = [{"step": r["step"], "metric": k, "value": float(v)} for r in steps for k, v in r.items() if k != "step"]
    # As the ablation sweep flow writes them: the swept value, the seed, and per-trial bookkeeping keys.
    params = {"grpo.lr": lr, "seed": seed, "sampling.seed": seed + 100, "name": run_id, "grpo.beta": 0.01,
              "data.source": "synthetic", "sweep.id": SWEEP, "sweep.trial_id": f"t{LRS.index(lr) * 3 + seed:02d}",
              "sweep.trial_label": f"grpo.lr={lr} seed={seed}"}
    run = {"run_id": run_id, "experiment": EXPERIMENT, "name": run_id, "kind": "trial",
           "status": "FAILED" if collapsed else "FINISHED", "started_at": f"2026-11-2{SEEDS.index(seed) + 1} 0{LRS.index(lr)}:00:00",
           "duration_s": 100.0 + seed, "config_hash": "c" * 64, "git_dirty": False,
           **({"tags": {"collapsed": "true", "stopped_at_step": "22"}} if collapsed else {"tags": ["sweep"]})}
    tables = {"evals/samples.parquet": pa.Table.from_pylist(sample_rows),
              "evals/metrics.parquet": pa.Table.from_pylist(metric_rows),
              "passk_curves.parquet": pa.Table.from_pylist(curve_rows),
              "train/steps_long.parquet": pa.Table.from_pylist(steps_long),
              "train/health_events.parquet": warehouse.health_events_table(firings),
              "train/rollouts.parquet": pa.Table.from_pylist(rollouts)}
    probe_tokens, probe_tables = [], {}
    if run_id == PROBED:
        # Token rows in the probe's own schema; the summary tables come from the probe's own `summarise`,
        # and everything is published the way rlvr_core.probe.report.publish lays it out (<run>/probe/).
        from rlvr_core.probe.categories import CATEGORIES
        from rlvr_core.probe.tables import TOKENS_SCHEMA, summarise

        for step in (10, 20, 30):
            for pos in range(24):
                scale = {10: 0.6, 20: 1.0, 30: 0.5}[step]  # rises then falls: a peak (turning point) at step 20
                kl_ab, kl_ba = (rng.uniform(0, 0.4) * scale) ** 2, (rng.uniform(0, 0.4) * scale) ** 2
                la, lb = -rng.uniform(0.1, 3), -rng.uniform(0.1, 3)
                probe_tokens.append({
                    "probe_id": "rl-probe", "checkpoint_a": "base", "checkpoint_b": f"step{step}", "step_b": step,
                    "sequence_id": f"synthetic-{pos % 4:03d}/0", "problem_id": f"synthetic-{pos % 4:03d}",
                    "sample_index": 0, "source": "a", "position": pos // 4, "token_id": 100 + pos,
                    "token_text": f"t{pos}", "category": CATEGORIES[pos % len(CATEGORIES)], "logp_a": la,
                    "logp_b": lb, "dlogp": lb - la, "kl_ab": kl_ab, "kl_ba": kl_ba, "kl_sym": kl_ab + kl_ba,
                    "entropy_a": rng.uniform(0, 2), "entropy_b": rng.uniform(0, 2), "is_spike": kl_ba > 0.05})
        probe_tables = summarise(pa.Table.from_pylist(probe_tokens, schema=TOKENS_SCHEMA)).as_dict()
        for name, table in probe_tables.items():
            tables[f"probe/{name}.parquet"] = table
    write_run_folder(local, run=run, params=params, manifest={}, config_yaml="", summary={}, tables=tables)
    ck = local / "checkpoints" / "trained"
    ck.mkdir(parents=True)
    (ck / "export_manifest.json").write_text(json.dumps({
        "schema": 1, "kind": "rlvr.checkpoint_export", "created_at": "2026-11-22T01:02:03Z", "step": STEPS,
        "tag": f"step{STEPS}", "dtype": "float32", "zero_stage": 2,
        "model": {"class": "Qwen2ForCausalLM", "n_parameters": 812_000},
        "files": [{"path": "model.safetensors", "size": 3_248_000, "sha256": "0" * 64},
                  {"path": "config.json", "size": 700, "sha256": "1" * 64}]}))
    upload_run_folder(store, join(EXPERIMENT, run_id), local)
    return {"params": params, "greedy": greedy, "sampled": sampled, "accuracy": accuracy, "steps": steps,
            "firings": firings, "collapsed": collapsed, "curve": curve_rows, "probe_tokens": probe_tokens,
            "probe_tables": {k: v.to_pylist() for k, v in probe_tables.items()}, "n_rollouts": len(rollouts)}
