"""The ahead sampler (rlvr_core/grpo/ahead.py) on its own: which weights sample which step, how far the
producer may run ahead, and what happens when either side fails. A one-weight linear model stands in for
the policy: its weight *is* the version number, so every sample says which version produced it."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from rlvr_core.grpo.ahead import AheadSampler, snapshot


def _versioned(v: int) -> dict[str, torch.Tensor]:
    return {"weight": torch.full((1, 1), float(v)), "bias": torch.zeros(1)}


def _trainer(s: int, steps: int, sample, first_step: int = 0, before: dict | None = None, train_s: float = 0.0):
    """Drive an AheadSampler like the trainer does: publish, take, 'train', publish the next version."""
    model = torch.nn.Linear(1, 1)
    ahead = AheadSampler(model.load_state_dict, sample(model), first_step=first_step, last_step=steps, max_staleness=s, timeout_s=10)
    for v, w in sorted((before or {}).items()):
        ahead.publish(v, w)
    ahead.publish(first_step, _versioned(first_step))
    ahead.start()
    got = []
    try:
        for step in range(first_step, steps):
            batch, _ = ahead.take(step)
            got.append(batch)
            time.sleep(train_s)
            ahead.publish(step + 1, _versioned(step + 1))
    finally:
        ahead.close()
    return ahead, got


@pytest.mark.parametrize("s", [1, 2, 3])
def test_step_t_samples_version_t_minus_s_and_never_runs_further_ahead(s):
    published = []  # what the trainer had published when the producer sampled each step
    lock = threading.Lock()

    def sample(model):
        def run(step):
            with lock:
                latest = max(published) if published else None
            return {"step": step, "weight": float(model.weight.detach()), "latest": latest}
        return run

    real_publish = AheadSampler.publish

    def publish(self, version, weights):
        real_publish(self, version, weights)
        with lock:
            published.append(version)

    AheadSampler.publish = publish
    try:
        ahead, got = _trainer(s, 8, sample, train_s=0.01)
    finally:
        AheadSampler.publish = real_publish
    assert [b.step for b in got] == list(range(8))
    for b in got:
        assert b.version == max(0, b.step - s) == b.groups["weight"]  # the model held exactly that version
        assert b.groups["latest"] - b.step <= 0 <= b.groups["latest"] - b.step + s  # never more than s ahead
    stats = ahead.buffer.stats()
    assert stats["evicted"] == 0 and stats["high_water"] <= s + 1


def test_resume_publishes_the_saved_versions_and_checkpoints_keep_what_the_next_steps_need():
    def sample(model):
        return lambda step: float(model.weight.detach())

    # A resume at step 5 with s = 2: steps 5 and 6 need versions 3 and 4, which came from the checkpoint.
    ahead, got = _trainer(2, 9, sample, first_step=5, before={3: _versioned(3), 4: _versioned(4)})
    assert [(b.step, b.version, b.groups) for b in got] == [(5, 3, 3.0), (6, 4, 4.0), (7, 5, 5.0), (8, 6, 6.0)]
    # After step 9's version is published, a checkpoint at 9 holds versions 7 and 8, and nothing older.
    kept = ahead.for_checkpoint(9)
    assert sorted(kept) == [7, 8] and float(kept[8]["weight"]) == 8.0


def test_a_failing_producer_reaches_the_trainer_and_a_failing_trainer_stops_the_producer():
    def sample(model):
        def run(step):
            if step == 2:
                raise ValueError("engine fell over")
            return step
        return run

    with pytest.raises(RuntimeError, match="ahead sampler failed before step 3.*engine fell over"):
        _trainer(1, 5, sample)

    # The trainer stops after one step (a guard fired): close() ends the producer, blocked or not.
    model = torch.nn.Linear(1, 1)
    ahead = AheadSampler(model.load_state_dict, lambda step: step, first_step=0, last_step=100, max_staleness=1, timeout_s=10)
    ahead.publish(0, snapshot(model))
    ahead.start()
    ahead.take(0)
    t0 = time.perf_counter()
    ahead.close()
    assert time.perf_counter() - t0 < 5 and not ahead._thread.is_alive()


def test_no_wait_is_forever():
    # G-partial-batch: a consumer never waits forever for a step that does not come.
    model = torch.nn.Linear(1, 1)
    ahead = AheadSampler(model.load_state_dict, lambda step: step, first_step=0, last_step=3, max_staleness=1, timeout_s=0.2)
    ahead.start()  # version 0 is never published: the producer gives up, the trainer hears why
    with pytest.raises(RuntimeError, match="policy version 0 was not published"):
        ahead.take(0)
    ahead.close()
    # A resume at step 4 with s = 1 that forgot version 3: a clear error at once, not a wait for the timeout.
    ahead = AheadSampler(model.load_state_dict, lambda step: step, first_step=4, last_step=6, max_staleness=1, timeout_s=600)
    ahead.publish(4, snapshot(model))
    ahead.start()
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match=r"version 3 is needed but was never published \(have \[4\]\)"):
        ahead.take(4)
    assert time.perf_counter() - t0 < 5
    ahead.close()
    with pytest.raises(ValueError, match="max_staleness must be >= 1"):
        AheadSampler(model.load_state_dict, lambda step: step, first_step=0, last_step=3, max_staleness=0)
