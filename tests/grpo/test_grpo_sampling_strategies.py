"""Dynamic-sampling filter, adaptive-sampling stopping rule, bounded buffer and batcher.

Timeouts here are tens of milliseconds: the point is that every wait ends, not how long it takes.
"""

from __future__ import annotations

import threading

import pytest
import torch

from rlvr_core.grpo import AdaptiveSamplingState, BoundedBuffer, BufferClosed, filter_zero_variance_groups

SHORT = 0.05


def test_dynamic_sampling_filter_hand_example():
    # groups: all correct, mixed, all wrong, mixed -> drop 2 of 4
    r = torch.tensor([[1, 1, 1], [1, 0, 1], [0, 0, 0], [0, 0, 1]], dtype=torch.float32)
    res = filter_zero_variance_groups(r)
    assert res.keep_groups.tolist() == [False, True, False, True]
    assert (res.n_groups, res.n_dropped, res.n_kept) == (4, 2, 2)
    assert res.keep_samples.tolist() == [False] * 3 + [True] * 3 + [False] * 3 + [True] * 3
    # flat layout, bf16, and a tolerance for continuous rewards
    flat = filter_zero_variance_groups(r.reshape(-1).to(torch.bfloat16), 3)
    assert torch.equal(flat.keep_groups, res.keep_groups)
    cont = torch.tensor([[0.5, 0.5 + 1e-9], [0.1, 0.9]], dtype=torch.float64)
    assert filter_zero_variance_groups(cont, atol=1e-6).keep_groups.tolist() == [False, True]
    with pytest.raises(ValueError):
        filter_zero_variance_groups(torch.zeros(5), 2)
    # Groups of different sizes padded with NaN (adaptive sampling): the padding is not a reward.
    padded = torch.tensor([[1, 1, float("nan"), float("nan")], [1, 0, float("nan"), float("nan")],
                           [0, 0, 0, 0], [0, 0, 1, float("nan")]])
    assert filter_zero_variance_groups(padded).keep_groups.tolist() == [False, True, False, True]


def test_adaptive_sampling_stops_when_both_counts_reached():
    s = AdaptiveSamplingState(k_success=2, k_failure=1, max_samples=20, chunk_size=4)
    assert s.next_chunk() == 4 and not s.done
    s = s.observe([False, False, False, False])   # 0 successes, 4 failures
    assert not s.done and s.failures == 4
    s = s.observe([True, False, False, False])    # 1 success
    assert not s.done
    s = s.observe([False, True, False, False])    # 2 successes -> enough
    assert s.done and s.stop_reason == "enough" and s.next_chunk() == 0 and s.n == 12


def test_adaptive_sampling_respects_max():
    s = AdaptiveSamplingState(k_success=1, k_failure=1, max_samples=10, chunk_size=4)
    sizes = []
    while not s.done:
        sizes.append(s.next_chunk())
        s = s.observe([False] * sizes[-1])
    assert sizes == [4, 4, 2] and s.n == 10 and s.stop_reason == "max_samples"
    with pytest.raises(ValueError, match="exceed"):
        AdaptiveSamplingState(1, 1, 3, 2).observe([True] * 4)
    assert AdaptiveSamplingState(0, 0, 5, 2).done  # no requirement: nothing to sample
    with pytest.raises(ValueError):
        AdaptiveSamplingState(-1, 0, 5, 2)


def test_buffer_back_pressure_and_timeouts():
    buf = BoundedBuffer[int](capacity=2)
    buf.put(1)
    assert buf.try_put(2)
    assert not buf.try_put(3)  # full: the producer is told to wait
    with pytest.raises(TimeoutError, match="full"):
        buf.put(3, timeout=SHORT)
    assert buf.get() == 1 and buf.get() == 2
    with pytest.raises(TimeoutError, match="empty"):
        buf.get(timeout=SHORT)
    for bad in (None, float("inf"), -1):
        with pytest.raises(ValueError):
            buf.get(timeout=bad)
    s = buf.stats()
    assert s["high_water"] == 2 and s["puts"] == 2 and s["gets"] == 2 and s["put_wait_s"] >= SHORT * 0.5


def test_blocked_producer_resumes_when_consumer_takes():
    buf = BoundedBuffer[int](capacity=1)
    buf.put(0)
    t = threading.Thread(target=lambda: buf.put(1, timeout=5.0))
    t.start()
    assert buf.get(timeout=1.0) == 0
    assert buf.get(timeout=1.0) == 1
    t.join(timeout=1.0)
    assert not t.is_alive()


def test_staleness_evictions_are_counted():
    buf = BoundedBuffer[str](capacity=10, max_staleness=1)
    for v, item in [(0, "a"), (0, "b"), (1, "c"), (2, "d")]:
        buf.put(item, version=v)
    buf.set_version(2)  # version 0 is now older than 2 - 1: "a", "b" evicted
    assert buf.evicted == 2 and len(buf) == 2
    assert buf.get() == "c"
    buf.put("e", version=2)
    buf.set_version(3)  # "d" (2) and "e" (2) are still within staleness 1
    assert buf.get() == "d" and buf.evicted == 2
    with pytest.raises(ValueError, match="backwards"):
        buf.set_version(1)


def test_closed_buffer_drains_then_ends():
    buf = BoundedBuffer[int](capacity=3)
    buf.put(1)
    buf.close()
    with pytest.raises(BufferClosed):
        buf.put(2)
    assert buf.get() == 1
    with pytest.raises(BufferClosed):
        buf.get(timeout=SHORT)


def test_threaded_producer_consumer_with_small_buffer():
    buf = BoundedBuffer[int](capacity=2)

    def produce():
        for i in range(11):
            buf.put(i, timeout=5.0)
        buf.close()

    t = threading.Thread(target=produce)
    t.start()
    got = []
    while True:
        try:
            got.append(buf.get(timeout=5.0))
        except BufferClosed:
            break
    t.join(timeout=5.0)
    assert got == list(range(11))
    assert buf.stats()["high_water"] <= 2 and buf.evicted == 0
