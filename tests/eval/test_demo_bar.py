"""The bar of issue 6: `rlvr eval` on the demo's base and trained checkpoints reproduces the demo's numbers
exactly (same benchmark, seeds and settings), and `rlvr compare` reads the demo's run from the artifact store.

A reduced demo (a smaller tiny model, fewer warm-start steps and pass-rate prompts, 2 GRPO steps) keeps this
within CI's budget; the held-out evaluation keeps synthetic.yaml's settings (200-problem test split, 8
samples at T=1, max 48 tokens), limited to its first 40 problems on both sides.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.slow

DEMO = ["--set", "model.tiny.hidden_size=64", "--set", "model.tiny.num_layers=2", "--set", "model.warm_start.steps=100",
        "--set", "passk.max_prompts=24", "--set", "passk.n_samples=4", "--set", "passk.ks=[1,2,4]",
        "--set", "eval.max_problems=40", "--set", "tracking.experiment=bar",
        "--set", "grpo.enabled=true", "--set", "grpo.steps=2", "--set", "grpo.prompts_per_step=2",
        "--set", "grpo.group_size=4", "--set", "grpo.checkpoint_every=2", "--set", "grpo.eval_every=2"]


def run(home: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PREFECT_", "RLVR_"))}
    env.update({"RLVR_HOME": str(home), "OMP_NUM_THREADS": "1"})
    return subprocess.run(list(args), env=env, capture_output=True, text=True, timeout=timeout)


def last_json(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    s = last_json(run(home, str(Path(sys.executable).parent / "rlvr"), "demo", "--json", "--quiet", *DEMO))
    return home, s


def rlvr_eval(home: Path, checkpoint: str, eval_id: str) -> dict:
    out = home / f"eval-{eval_id}"
    res = last_json(run(home, sys.executable, "-m", "rlvr_cli.eval", "eval", checkpoint, "--benchmark", "synthetic",
                        "--max-problems", "40", "--eval-id", eval_id, "--out", str(out), "--quiet", "--json"))
    return {**res["benchmarks"]["synthetic"], "out": out}


def test_eval_reproduces_the_demo_numbers_exactly(demo):
    home, s = demo
    run_dir = Path(s["artifact_uri"])
    base_path = json.loads((run_dir / "manifest.json").read_text())["model"]["path"]
    demo_rows = pq.read_table(run_dir / "evals" / "samples.parquet").to_pylist()
    key = ("problem_id", "sample_index", "greedy", "response", "status", "extracted", "finish_reason")
    for eval_id, path, prefix in (("base", base_path, "base"), ("trained", s["export"]["uri"], "trained")):
        e = rlvr_eval(home, path, eval_id)
        assert e["n"] == s["n_eval"] == 40
        # Exact equality, not approx: same problems, prompts, seeds, decoding and verifier.
        assert e["accuracy_greedy"] == s[f"{prefix}_pass_at_1"]
        assert e["accuracy_greedy_ci"] == s[f"{prefix}_pass_at_1_ci95"]
        assert e["passk"] == s[f"{prefix}_pass_at_k"]
        ours = [tuple(r[k] for k in key) for r in pq.read_table(e["out"] / "evals" / "samples.parquet").to_pylist()]
        theirs = [tuple(r[k] for k in key) for r in demo_rows if r["eval_id"] == eval_id]
        assert ours == theirs
    # The comparison accepts the demo's evaluation and ours as one setting (nothing differs) and finds no change.
    cmp = last_json(run(home, sys.executable, "-m", "rlvr_cli.eval", "compare", f"{s['mlflow_run_id']}#base",
                        str(home / "eval-base"), "--json"))
    d = cmp["benchmarks"]["synthetic"]["deltas"]
    assert cmp["settings_differ"] == {} and all(v["delta"] == 0 for v in d.values())


def test_compare_the_demo_run_base_vs_trained(demo):
    home, s = demo
    cmp = last_json(run(home, sys.executable, "-m", "rlvr_cli.eval", "compare", f"{s['mlflow_run_id']}#base",
                        f"{s['mlflow_run_id']}#trained", "--json"))
    r = cmp["benchmarks"]["synthetic"]
    assert r["deltas"]["accuracy_greedy"]["delta"] == pytest.approx(s["delta_pass_at_1"])
    assert r["passk_curves"]["b"]["8"] == pytest.approx(s["trained_pass_at_k"]["8"])
    assert r["n_problems"] == 40
