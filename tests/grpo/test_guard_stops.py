"""The serious training guards stop a real run (BUGZOO G-collapse, G-entropy, G-kl-explosion).

Each test plants the failure in a real `train_grpo` run (the tiny model of grpo_helpers.py, real DeepSpeed steps
on CPU, the parity test verifier) and checks the whole stop, not only the detector: `GuardError` naming the
guard, at the step where the detector (run again on the recorded rows) first finds a serious firing; the
rows up to that step and a summary tagged `collapsed` with `stopped_at_step` and the firings, which
the warehouse's `health_events` table takes as they are; no final model, and no checkpoint at or after the
stop step (every checkpoint before it is kept, `latest` names the last good one). Thresholds that the tiny model
cannot reach in a few steps are lowered through `grpo.guards.health`, the public config, and each test says which.
The detectors' numbers against the reported incidents are in test_grpo_guards.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from rlvr_core.core.registry import ADVANTAGES
from rlvr_core.experiment.guards import (GUARD_COLLAPSE, GUARD_ENTROPY, GUARD_KL_EXPLOSION, GuardError, HealthConfig,
                                         check_health)
from rlvr_core.artifacts.layout import STEPS_FILE, SUMMARY_FILE
from rlvr_core.grpo.checkpointing import CHECKPOINTS, FINAL_MODEL
from rlvr_core.records.warehouse import health_events_table
from grpo_helpers import VERIFIER, tiny_cfg, train_tiny

NO_EPS = "_test_std_without_eps"


def _std_without_eps(rewards: torch.Tensor, group_size=None, *, group_ids=None, eps: float = 0.0) -> torch.Tensor:
    """A planted bug: GRPO's advantage without the epsilon under the group std. A group whose completions all
    get the same reward has std 0, so its advantages are 0 / 0 = NaN, and so is the step's loss."""
    return (rewards - rewards.mean(dim=1, keepdim=True)) / rewards.std(dim=1, keepdim=True)


@pytest.fixture
def no_eps_advantage(monkeypatch):
    """`grpo.advantage: _test_std_without_eps`, registered for one test only: the docs-coverage test
    (test_grpo_docs.py) requires every registered name to be documented."""
    monkeypatch.setitem(ADVANTAGES._items, NO_EPS, _std_without_eps)
    return NO_EPS


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _stopped_run(tiny, out: Path, cfg, guard: str) -> tuple[dict, list[dict], str]:
    """Train until the guard stops the run; (summary, step rows, GuardError message)."""
    with pytest.raises(GuardError) as e:
        train_tiny(tiny, out, cfg)
    assert guard in str(e.value)
    summary = json.loads((out / SUMMARY_FILE).read_text())
    assert (e.value.guard, e.value.step) == (guard, summary["stopped_at_step"])  # its fields, not its message
    return summary, pq.read_table(out / STEPS_FILE).to_pylist(), str(e.value)


def _assert_stopped(out: Path, cfg, summary: dict, rows: list[dict], guard: str, step: int) -> None:
    """The run stopped at `step` for `guard` and kept nothing of that step's state."""
    assert "collapsed" in summary["tags"] and summary["done"] is False
    assert summary["stopped_at_step"] == summary["steps"] == step and summary["stopped_by"] == [guard]
    assert [r["step"] for r in rows] == list(range(1, step + 1)) and rows[-1][f"health/{guard}"] == 1
    assert summary["guards"][f"health/{guard}"] >= 1
    serious = [(f["guard_id"], f["step"]) for f in summary["health_firings"] if f["serious"]]
    assert serious == [(guard, step)]
    # The summary's firings are what the warehouse's health_events table is built from (one row per firing).
    events = health_events_table(summary["health_firings"]).to_pylist()
    assert [(e["guard_id"], e["step"], e["serious"]) for e in events] == \
        [(f["guard_id"], f["step"], f["serious"]) for f in summary["health_firings"]]
    assert not (out / FINAL_MODEL).exists()
    every = cfg.checkpoint_every
    kept = sorted(int(p.name.removeprefix("step")) for p in (out / CHECKPOINTS).glob("step*"))
    assert kept == list(range(every, step, every)), f"checkpoints {kept} with a stop at step {step}"
    if kept:
        assert (out / CHECKPOINTS / "latest").read_text().strip() == f"step{kept[-1]}"


def _first_serious(rows: list[dict], cfg) -> tuple[str, int]:
    """The detectors' first serious firing on the recorded rows (the step the run must stop at)."""
    f = next(f for f in check_health(rows, cfg.guards.health) if f.serious)
    return f.guard_id, f.step


def test_collapse_at_a_huge_lr_stops_the_run(tiny, tmp_path):
    # lr 0.5: within ~4 steps the policy turns deterministic (entropy ~4.5 -> ~0.01) and each group's completions
    # become identical. Default thresholds; the detector can first judge step 10 (5 baseline + 5 window steps).
    cfg = tiny_cfg(steps=14, lr=0.5, warmup_steps=2, checkpoint_every=5)
    summary, rows, msg = _stopped_run(tiny, tmp_path / "run", cfg, GUARD_COLLAPSE)
    step = summary["stopped_at_step"]
    assert 10 <= step < cfg.steps and _first_serious(rows, cfg) == (GUARD_COLLAPSE, step)
    assert f"{GUARD_COLLAPSE} at step {step}" in msg and "entropy" in msg
    _assert_stopped(tmp_path / "run", cfg, summary, rows, GUARD_COLLAPSE, step)


def test_entropy_collapse_far_from_the_reference_stops_the_run(tiny, tmp_path):
    # BUGZOO: beta 1e-4, entropy 0.008, kl_max 9,748. Here beta 1e-3 and lr 0.5: entropy ~4.5 -> ~0.01 by step 5
    # with the token KL to the reference near 2. Lowered through grpo.health so that this happens within a few
    # steps: the entropy window and baseline (3 steps each, first judged at step 6, before G-collapse can judge
    # at step 10) and the KL that makes a low entropy serious (2 instead of 1000).
    # The KL detector's default stop on collapsing rollouts (its window median passes 0.25 with most completions
    # truncated by step 5) is turned off: this test is about G-entropy's own stop.
    health = {"entropy": {"window": 3, "baseline_steps": 3, "serious_kl_max": 2.0},
              "kl_explosion": {"serious_on_collapse": False}}
    cfg = tiny_cfg(steps=12, lr=0.5, warmup_steps=2, beta=1e-3, checkpoint_every=2, health=health)
    summary, rows, msg = _stopped_run(tiny, tmp_path / "run", cfg, GUARD_ENTROPY)
    step = summary["stopped_at_step"]
    assert 6 <= step < 10 and _first_serious(rows, cfg) == (GUARD_ENTROPY, step)
    assert max(r["kl_ref_max"] for r in rows[-3:]) >= 2.0 and "far from the reference" in msg
    _assert_stopped(tmp_path / "run", cfg, summary, rows, GUARD_ENTROPY, step)
    # The same rows under the default serious KL (1000) are an entropy flag only: the KL is what makes it a stop.
    flags = check_health(rows, HealthConfig.model_validate({"entropy": {"window": 3, "baseline_steps": 3}}))
    assert [f.serious for f in flags if f.guard_id == GUARD_ENTROPY] == [False]


def test_kl_blow_up_made_serious_stops_the_run(tiny, tmp_path):
    # beta 0.1 and lr 0.5: the mean token KL to the reference passes the detector's 0.25 within 2 steps. Default
    # thresholds; `kl_explosion: {serious: true}` is what makes the episode a stop (by default it is a flag).
    # kl_spike_max lowered from 10 to 5 so that the per-step flag is seen on single steps before the stop.
    cfg = tiny_cfg(steps=10, lr=0.5, warmup_steps=2, beta=0.1, checkpoint_every=2,
               guards={"kl_spike_max": 5.0, "health": {"kl_explosion": {"serious": True}}})
    summary, rows, msg = _stopped_run(tiny, tmp_path / "run", cfg, GUARD_KL_EXPLOSION)
    step = summary["stopped_at_step"]
    assert 5 <= step < cfg.steps and _first_serious(rows, cfg) == (GUARD_KL_EXPLOSION, step)
    assert f"{GUARD_KL_EXPLOSION} at step {step}" in msg
    _assert_stopped(tmp_path / "run", cfg, summary, rows, GUARD_KL_EXPLOSION, step)
    # The per-step flag (G-kl-explosion, kl_ref_max > kl_spike_max) on the steps before the stop.
    spikes = [int(r["kl_ref_max"] > cfg.guards.kl_spike_max) for r in rows[:-1]]
    assert any(spikes) and [r[f"health/{GUARD_KL_EXPLOSION}"] for r in rows[:-1]] == spikes


def test_non_finite_loss_stops_the_run_with_a_summary(tiny, tmp_path, no_eps_advantage):
    # The planted advantage estimator (`_std_without_eps`) makes the loss NaN at the first step with a group whose
    # rewards are all equal.
    cfg = tiny_cfg(steps=8, checkpoint_every=1, advantage=NO_EPS)
    summary, rows, msg = _stopped_run(tiny, tmp_path / "run", cfg, GUARD_KL_EXPLOSION)
    step = summary["stopped_at_step"]
    assert [r["zero_var_group_share"] > 0 for r in rows] == [False] * (step - 1) + [True]
    assert [math.isfinite(r["loss"]) for r in rows] == [True] * (step - 1) + [False]
    assert "non-finite loss" in msg and summary["tags"] == ["collapsed", "non_finite_loss"]
    [stop] = [f for f in summary["health_firings"] if f["serious"]]
    assert stop["key"] == "non_finite_loss" and stop["evidence"]["loss"] == "nan"
    _assert_stopped(tmp_path / "run", cfg, summary, rows, GUARD_KL_EXPLOSION, step)


def test_a_stopped_training_stage_is_not_retried_and_leaves_nothing_to_export(tiny, rlvr_home, tmp_path,
                                                                              no_eps_advantage):
    # The pipeline's training stage (rlvr_core.pipeline.stages.train_stage, as the grpo-train task calls it) on
    # the non-finite-loss plant: the GuardError leaves the stage, which returns no TrainArtifact (so the flow
    # never reaches export) and does not mark its folder done; the task's retry rule does not retry it.
    from rlvr_core.experiment.config import parse_config
    from rlvr_core.pipeline import stages
    from rlvr_core.sampling.models import model_hashes
    from rlvr_core.pipeline.child.transient import is_transient

    cfg = parse_config({"data": {"synthetic": {"n_train": 40, "n_test": 4}}, "sampling": {"max_new_tokens": 12},
                        "eval": {"max_problems": 2, "verifier_workers": 0},
                        "reward": {"verifier": VERIFIER, "workers": 0},
                        "grpo": {"enabled": True, "steps": 8, "prompts_per_step": 4, "group_size": 4, "lr": 1e-2,
                                 "warmup_steps": 0, "checkpoint_every": 1, "advantage": NO_EPS}}, "<stop test>")
    data = stages.prepare_data(cfg)
    base = stages.ModelArtifact(str(tiny[0]), "tiny", *model_hashes(Path(tiny[0])), True)
    cur_path = tmp_path / "curriculum.parquet"
    pq.write_table(pa.table({"problem_id": [r["id"] for r in data.train_rows()[:12]]}), cur_path)
    with pytest.raises(GuardError) as e:
        stages.train_stage(cfg, data, base, stages.CurriculumArtifact(str(cur_path), "stop-test", 12, False))
    assert "non-finite loss" in str(e.value) and not is_transient(e.value)
    [folder] = [p.parent for p in (rlvr_home / "cache" / "grpo").glob(f"*/{SUMMARY_FILE}")]
    summary = json.loads((folder / SUMMARY_FILE).read_text())
    assert summary["tags"] == ["collapsed", "non_finite_loss"]
    assert not (folder / ".done").exists() and not (folder / "result.json").exists()
    assert not (folder / FINAL_MODEL).exists()
    latest = folder / CHECKPOINTS / "latest"
    assert not latest.exists() or latest.read_text().strip() == f"step{summary['stopped_at_step'] - 1}"
