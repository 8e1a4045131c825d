"""The trainer's per-step metrics reach MLflow while it trains (`train_grpo(on_step=StepMetricsSink)`), each
step at its own step and time, and a resumed training logs no step twice. Real DeepSpeed steps on CPU with
test_trainer's tiny model; a real MLflow sqlite store."""

from __future__ import annotations

import time

import pyarrow.parquet as pq
import pytest

from grpo_helpers import tiny_cfg, train_tiny
from rlvr_core.records.tracking import StepMetricsSink, Tracker


class Killed(Exception):
    pass


def _visible_steps(client, run: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run, "train/loss"))


def _hook(sink: StepMetricsSink, client, run: str, seen: list, kill_after: int | None = None):
    """The trainer's on_step: hand the row to the sink, then check (inside training, before train_grpo
    returns) that this step is already in MLflow; optionally die after step `kill_after`, as a killed job."""
    def on_step(row: dict) -> None:
        sink(row)
        deadline = time.monotonic() + 30
        while row["step"] not in _visible_steps(client, run):
            assert time.monotonic() < deadline, f"step {row['step']} not in MLflow during training"
            time.sleep(0.05)
        seen.append(row["step"])
        if row["step"] == kill_after:
            raise Killed(f"killed after step {kill_after}")
    return on_step


def test_steps_reach_mlflow_during_training_and_once_after_resume(tiny, tmp_path, rlvr_home):  # noqa: F811
    tracker = Tracker("live-train")
    run = tracker.start_run("train", {})
    cfg = tiny_cfg(steps=4, checkpoint_every=2)
    seen: list[int] = []
    # Killed after step 3 was sent but before its checkpoint: the resume starts again at step 3.
    with pytest.raises(Killed):
        with StepMetricsSink(run, tracker.tracking_uri, every_steps=1, every_s=0.1) as sink:
            train_tiny(tiny, tmp_path / "out", cfg, on_step=_hook(sink, tracker.client, run, seen, kill_after=3))
    assert seen == [1, 2, 3]
    with StepMetricsSink(run, tracker.tracking_uri, every_steps=1, every_s=0.1) as sink:
        result = train_tiny(tiny, tmp_path / "out", cfg, on_step=_hook(sink, tracker.client, run, seen))
    assert seen == [1, 2, 3, 3, 4]  # steps 3 and 4 trained (again) after the resume ...
    hist = sorted(tracker.client.get_metric_history(run, "train/loss"), key=lambda m: m.step)
    assert [m.step for m in hist] == [1, 2, 3, 4]  # ... but each step is in MLflow once
    stamps = [m.timestamp for m in hist]
    assert stamps == sorted(stamps) and len(set(stamps)) == 4  # each at the time its step finished
    rows = pq.read_table(result.steps_path).to_pylist()
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    names = set(tracker.client.get_run(run).data.metrics)
    assert {"train/reward_mean", "train/tokens_per_s", "health/G-kl-explosion"} <= names
    assert tracker.log_step_rows(run, rows) == 0  # the record afterwards finds nothing missing
