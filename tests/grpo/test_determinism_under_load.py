"""Same inputs, same numbers, whatever else the machine is doing.

The training stage (data → warm start → pass rates → curriculum → GRPO, the pipeline's own stage
functions) runs twice in fresh processes with fresh homes, with the same seed and two torch threads:
once on a quiet machine, once while busy-loop processes (one per core) hold every core. Every per-step number of the
trainer (rewards, losses, KL, token counts, the held-out evaluation at the end), the base and trained
weights' hashes and the pass-rate table must be identical. Wall-clock columns are the only thing allowed
to differ. The run also has to record the thread count it ran with (the GRPO summary's `numerics`),
because at another thread count the same inputs give other numbers.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

THREADS = 2

_STAGE = r"""
import json, sys
import pyarrow.parquet as pq
from rlvr_core.experiment.config import parse_config
from rlvr_core.pipeline import stages

cfg = parse_config({
    "data": {"synthetic": {"n_train": 240, "n_test": 24}},
    "model": {"tiny": {"hidden_size": 48, "num_layers": 2, "num_heads": 2, "vocab_size": 300},
              "warm_start": {"steps": 40, "teacher_sub_as_add": 0.5}},
    "passk": {"n_samples": 4, "ks": [1, 4], "drop_never_solved": False},
    "sampling": {"max_new_tokens": 32},
    "eval": {"n_samples": 4},
    "grpo": {"enabled": True, "steps": 6, "prompts_per_step": 4, "group_size": 4, "lr": 1e-3, "warmup_steps": 0,
             "temperature": 1.0, "dynamic_sampling": True, "eval_every": 3, "checkpoint_every": 1000},
}, "<determinism test>")
data = stages.prepare_data(cfg)
base = stages.prepare_base_model(cfg, data)
rates = stages.pass_rate_stage(cfg, data, base)
cur = stages.curriculum_stage(cfg, data, rates)
trained = stages.train_stage(cfg, data, base, cur)
steps = pq.read_table(trained.steps_path).to_pylist()
table = pq.read_table(rates.table_path).to_pylist()
json.dump({"base": base.model_hash, "trained": trained.model.model_hash, "steps": steps, "pass_rates": table,
           "summary_numerics": trained.summary.get("numerics")}, open(sys.argv[1], "w"), default=str)
"""


def _busy(stop_at: float) -> None:
    x = 0
    while time.monotonic() < stop_at:
        x += 1


def _run_stage(home: Path, out: Path) -> dict:
    env = {**os.environ, "RLVR_HOME": str(home), "OMP_NUM_THREADS": str(THREADS), "MKL_NUM_THREADS": str(THREADS),
           "TOKENIZERS_PARALLELISM": "false", "DS_ACCELERATOR": "cpu"}
    subprocess.run([sys.executable, "-c", _STAGE, str(out)], env=env, cwd=ROOT, check=True, timeout=900)
    return json.loads(out.read_text())


def _without_clocks(rows: list[dict]) -> list[dict]:
    """Per-step rows without wall-clock fields (seconds, rates, timestamps): those may differ, nothing else."""
    def clock(k: str) -> bool:
        return k.endswith(("_s", "_sec", "_seconds", "per_s", "_time")) or k in ("time", "timestamp", "wall")
    return [{k: v for k, v in r.items() if not clock(k)} for r in rows]


def test_training_stage_gives_identical_numbers_on_a_loaded_machine(tmp_path):
    quiet = _run_stage(tmp_path / "home-quiet", tmp_path / "quiet.json")

    ctx = mp.get_context("fork")
    hogs = [ctx.Process(target=_busy, args=(time.monotonic() + 900,), daemon=True) for _ in range(os.cpu_count() or 2)]
    for h in hogs:
        h.start()
    try:
        loaded = _run_stage(tmp_path / "home-loaded", tmp_path / "loaded.json")
    finally:
        for h in hogs:
            h.terminate()
            h.join()

    assert quiet["summary_numerics"]["torch_threads"] == THREADS
    assert loaded["summary_numerics"] == quiet["summary_numerics"]
    assert loaded["base"] == quiet["base"]
    assert loaded["pass_rates"] == quiet["pass_rates"]
    a, b = _without_clocks(quiet["steps"]), _without_clocks(loaded["steps"])
    assert len(a) == len(b) == 6 and any(k.startswith("eval/") for k in a[-1])
    assert any(r["reward_mean"] not in (0, 1) for r in a), "no learning signal: the comparison would be vacuous"
    for i, (ra, rb) in enumerate(zip(a, b)):
        assert ra == rb, f"step {i}: " + ", ".join(f"{k}: {ra.get(k)} vs {rb.get(k)}" for k in ra if ra.get(k) != rb.get(k))
    assert loaded["trained"] == quiet["trained"]


def test_a_different_thread_count_is_a_different_stage(tmp_path, monkeypatch):
    """The warm start's cache key carries the thread count: a run at another count does not reuse its model."""
    import torch

    from rlvr_core.experiment.config import parse_config
    from rlvr_core.pipeline import stages

    monkeypatch.setenv("RLVR_HOME", str(tmp_path))
    cfg = parse_config({"data": {"synthetic": {"n_train": 40, "n_test": 4}},
                        "model": {"tiny": {"hidden_size": 16, "num_layers": 1, "num_heads": 1, "vocab_size": 300},
                                  "warm_start": {"steps": 2, "batch_size": 4}}})
    data = stages.prepare_data(cfg)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = stages.prepare_base_model(cfg, data)
        torch.set_num_threads(2)
        two = stages.prepare_base_model(cfg, data)
        again = stages.prepare_base_model(cfg, data)
    finally:
        torch.set_num_threads(old)
    assert not one.cached and not two.cached and again.cached
    assert Path(one.path) != Path(two.path) and Path(two.path) == Path(again.path)
    assert json.loads((Path(one.path) / "warmstart.json").read_text())["torch_threads"] == 1
