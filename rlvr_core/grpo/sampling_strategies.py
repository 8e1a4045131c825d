"""The pure parts of the sampling strategies: which groups to keep, when to stop sampling a prompt, and
how rollouts flow from a producer (the sampler) to a consumer (the trainer) without unbounded growth
or unbounded waiting.

    filter_zero_variance_groups   DAPO dynamic sampling (https://arxiv.org/abs/2503.14476, sec. 3.2): a group
                                  whose completions all got the same reward has advantage 0 everywhere and
                                  only dilutes the batch, so it is dropped and counted.
    AdaptiveSamplingState         keep sampling one prompt in chunks until it has k_success successes and
                                  k_failure failures (so the group has signal), or until max_samples.
    BoundedBuffer                 producer/consumer queue with a capacity (back-pressure: a full buffer makes
                                  the producer wait) and an optional staleness bound whose evictions are
                                  counted (G-stale-buffer: an unbounded buffer grew and silently evicted 7,400
                                  samples).
                                  Every wait has a finite timeout: nothing here can block forever.

No torch in the buffer (items are opaque); the filter takes reward tensors. The GRPO trainer
uses the filter for `GRPOConfig.dynamic_sampling` (rounds bounded by `dynamic_sampling_max_rounds`, a
short batch trained as it is) and AdaptiveSamplingState for `GRPOConfig.adaptive_sampling`.
With `GRPOConfig.max_staleness` > 0 the ahead sampler (ahead.py) hands whole steps' rollouts to the
trainer through a BoundedBuffer.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Deque, Generic, Iterable, TypeVar

import torch

__all__ = ["DynamicSamplingResult", "filter_zero_variance_groups", "AdaptiveSamplingState",
           "BoundedBuffer", "BufferClosed", "DEFAULT_TIMEOUT_S"]

DEFAULT_TIMEOUT_S = 60.0  # long enough for a slow generation step, short enough that a stall is noticed


# ---- DAPO dynamic sampling ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class DynamicSamplingResult:
    keep_groups: torch.Tensor   # (B,) bool: group b has reward variance
    keep_samples: torch.Tensor  # (B*G,) bool: the same, per completion, in the flat layout
    n_groups: int
    n_dropped: int

    @property
    def n_kept(self) -> int:
        return self.n_groups - self.n_dropped


def filter_zero_variance_groups(rewards: torch.Tensor, group_size: int | None = None, *,
                                atol: float = 0.0) -> DynamicSamplingResult:
    """Mark groups whose rewards are all equal (max - min <= atol) for dropping.

    rewards: (B, G), or flat (B*G,) with group_size (contiguous groups). atol = 0 means exactly equal,
    which is right for 0/1 verifier rewards; use a small atol for continuous rewards. NaN marks an empty
    slot (groups of different sizes padded to the widest, as adaptive sampling gives) and is ignored.
    For 0/1 rewards this is DAPO's 0 < #correct < G condition.
    """
    if rewards.dim() == 1:
        if group_size is None or group_size < 1 or rewards.shape[0] % group_size:
            raise ValueError(f"flat rewards of length {rewards.shape[0]} need a group_size that divides it")
        grouped = rewards.reshape(-1, group_size)
    elif rewards.dim() == 2:
        if group_size is not None and group_size != rewards.shape[1]:
            raise ValueError(f"rewards are (B, G) = {tuple(rewards.shape)} but group_size={group_size}")
        grouped = rewards
    else:
        raise ValueError(f"rewards must be (B, G) or (B*G,), got {tuple(rewards.shape)}")
    g = grouped.to(torch.float64 if grouped.dtype == torch.float64 else torch.float32)
    filled = ~torch.isnan(g)
    hi = torch.where(filled, g, torch.full_like(g, -math.inf)).max(dim=1).values if g.shape[1] else None
    lo = torch.where(filled, g, torch.full_like(g, math.inf)).min(dim=1).values if g.shape[1] else None
    spread = hi - lo if g.shape[1] else torch.zeros(g.shape[0])
    keep = spread > atol
    n_groups = int(keep.shape[0])
    return DynamicSamplingResult(keep_groups=keep, keep_samples=keep.repeat_interleave(grouped.shape[1]),
                                 n_groups=n_groups, n_dropped=n_groups - int(keep.sum()))


# ---- adaptive sampling stopping rule --------------------------------------------------------------------------

@dataclass(frozen=True)
class AdaptiveSamplingState:
    """Immutable state of one prompt's adaptive sampling. Use:

        s = AdaptiveSamplingState(k_success=2, k_failure=2, max_samples=32, chunk_size=8)
        while not s.done:
            outcomes = sample_and_verify(prompt, s.next_chunk())   # list[bool]
            s = s.observe(outcomes)
        s.stop_reason  # "enough" or "max_samples"

    k_success / k_failure = 0 means "no requirement". With both 0 the prompt is done before sampling.
    """

    k_success: int
    k_failure: int
    max_samples: int
    chunk_size: int
    n: int = 0
    successes: int = 0

    def __post_init__(self) -> None:
        if self.k_success < 0 or self.k_failure < 0:
            raise ValueError("k_success and k_failure must be >= 0")
        if self.max_samples < 1 or self.chunk_size < 1:
            raise ValueError("max_samples and chunk_size must be >= 1")
        if not 0 <= self.successes <= self.n <= self.max_samples:
            raise ValueError(f"inconsistent counts: successes={self.successes}, n={self.n}, max={self.max_samples}")

    @property
    def failures(self) -> int:
        return self.n - self.successes

    @property
    def enough(self) -> bool:
        return self.successes >= self.k_success and self.failures >= self.k_failure

    @property
    def done(self) -> bool:
        return self.enough or self.n >= self.max_samples

    @property
    def stop_reason(self) -> str | None:
        if self.enough:
            return "enough"
        return "max_samples" if self.n >= self.max_samples else None

    def next_chunk(self) -> int:
        """How many completions to request next: 0 when done, never past max_samples."""
        return 0 if self.done else min(self.chunk_size, self.max_samples - self.n)

    def observe(self, outcomes: Iterable[bool]) -> "AdaptiveSamplingState":
        """New state after a chunk of verified outcomes (True = success). Rejects more than max_samples."""
        outs = [bool(o) for o in outcomes]
        if self.n + len(outs) > self.max_samples:
            raise ValueError(f"{len(outs)} outcomes would exceed max_samples={self.max_samples} (have {self.n})")
        return replace(self, n=self.n + len(outs), successes=self.successes + sum(outs))


# ---- bounded buffer ---------------------------------------------------------------------------------------

T = TypeVar("T")


class BufferClosed(Exception):
    """put() on a closed buffer, or get() on a closed buffer with nothing left: the stream has ended."""


def _check_timeout(timeout: float) -> float:
    # None or inf would let a caller wait forever, which is exactly the bug this module prevents.
    if timeout is None or not math.isfinite(timeout) or timeout < 0:
        raise ValueError(f"timeout must be a finite number of seconds >= 0, got {timeout!r}")
    return float(timeout)


class BoundedBuffer(Generic[T]):
    """Thread-safe FIFO with a capacity (back-pressure) and an optional staleness bound.

    Each item carries the policy `version` that produced it. With max_staleness = s, an item whose
    version is older than current_version - s is evicted (removed and counted), either when the trainer
    advances the version (`set_version`) or when a consumer reaches it. Evictions are a metric, never
    silent. put() waits while the buffer is full (up to timeout), so a fast producer slows to the
    consumer's pace instead of filling memory with samples that will go stale.
    """

    def __init__(self, capacity: int, *, max_staleness: int | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if max_staleness is not None and max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0 or None, got {max_staleness}")
        self.capacity = capacity
        self.max_staleness = max_staleness
        self._items: Deque[tuple[int, T]] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._version = 0
        self.evicted = 0
        self.high_water = 0
        self.puts = 0
        self.gets = 0
        self.put_wait_s = 0.0  # total time producers spent blocked: the back-pressure metric

    # -- producer side --
    def put(self, item: T, *, version: int = 0, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        """Append, waiting while full. Raises TimeoutError after `timeout` s, BufferClosed if closed."""
        timeout = _check_timeout(timeout)
        with self._cond:
            start = time.monotonic()
            deadline = start + timeout
            while len(self._items) >= self.capacity and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.put_wait_s += time.monotonic() - start
                    raise TimeoutError(f"buffer full ({self.capacity} items) for {timeout:.3g}s: consumer stalled?")
                self._cond.wait(left)
            self.put_wait_s += time.monotonic() - start
            self._append(item, version)

    def try_put(self, item: T, *, version: int = 0) -> bool:
        """Append without waiting; False when full (the caller should back off)."""
        with self._cond:
            if len(self._items) >= self.capacity and not self._closed:
                return False
            self._append(item, version)
            return True

    def _append(self, item: T, version: int) -> None:
        if self._closed:
            raise BufferClosed("put on a closed buffer")
        self._items.append((version, item))
        self.puts += 1
        self.high_water = max(self.high_water, len(self._items))
        self._cond.notify_all()

    def close(self) -> None:
        """No more items will come; consumers drain what is left, then get BufferClosed."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- consumer side --
    def set_version(self, version: int) -> None:
        """The trainer's current policy version; evicts items now too stale (frees room for the producer)."""
        with self._cond:
            if version < self._version:
                raise ValueError(f"policy version went backwards: {self._version} -> {version}")
            self._version = version
            self._evict_stale()
            self._cond.notify_all()

    def _is_stale(self, version: int) -> bool:
        return self.max_staleness is not None and version < self._version - self.max_staleness

    def _evict_stale(self) -> None:
        kept = deque(vi for vi in self._items if not self._is_stale(vi[0]))
        self.evicted += len(self._items) - len(kept)
        self._items = kept

    def get(self, timeout: float = DEFAULT_TIMEOUT_S) -> T:
        """Next fresh item, waiting while empty. TimeoutError after `timeout` s; BufferClosed at end of stream."""
        timeout = _check_timeout(timeout)
        with self._cond:
            deadline = time.monotonic() + timeout
            while True:
                while self._items:
                    version, item = self._items.popleft()
                    self._cond.notify_all()  # a slot is free: wake a waiting producer
                    if self._is_stale(version):
                        self.evicted += 1
                        continue
                    self.gets += 1
                    return item
                if self._closed:
                    raise BufferClosed("buffer closed and drained")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"buffer empty for {timeout:.3g}s and not closed: producer stalled?")
                self._cond.wait(left)

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)

    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self) -> dict[str, float]:
        """Metrics for tracking: size, capacity, high_water, evicted, puts, gets, put_wait_s."""
        with self._cond:
            return {"size": len(self._items), "capacity": self.capacity, "high_water": self.high_water,
                    "evicted": self.evicted, "puts": self.puts, "gets": self.gets, "put_wait_s": self.put_wait_s}
