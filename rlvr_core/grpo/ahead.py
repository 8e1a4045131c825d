"""Bounded-staleness rollouts: a background thread samples up to `max_staleness` steps ahead of the trainer.

With staleness s the rollouts of step t (0-based) come from the policy after max(0, t - s) updates, on
weights the rollout engine owns: the trainer publishes its weights after every step (a "weight sync",
`RolloutEngine.snapshot`), and the producer hands the version a step needs to the engine (`load`: the HF
engine's own copy of the model, or a vLLM engine's weights) before sampling it. Generation of step
t + 1 .. t + s then overlaps the training of step t. s = 0 is the trainer's ordinary on-policy loop,
which does not use this module.

Why the version is pinned instead of "the newest weights": BUGZOO G-stale-buffer. A producer that samples
with whatever weights it has runs ahead without bound, the buffer grows, and a staleness check on pop
throws the work away (seed 001: 7,400 samples evicted). Here the producer cannot outrun the bound: it waits
for the version it needs, and the buffer (capacity s + 1 batches, `BoundedBuffer`) makes it wait while
full. Nothing is evicted in a correct run, and the buffer's eviction count is logged so a bug would show.
Because the version of every step is fixed, a run with staleness is as deterministic, and as resumable,
as an on-policy one: a checkpoint at step c carries the s versions before c that steps c .. c + s - 1 need.

Every wait has a finite timeout, and an exception in the producer reaches the trainer at its next `take`.
No collective runs in the producer thread (it loads versions into, and samples, the rollout engine's own
weights, never the trained module), so it is safe under ZeRO-3 and with several ranks, each rank sampling
its own share of the prompts.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from rlvr_core.experiment.guards import GuardError
from rlvr_core.grpo.sampling_strategies import BoundedBuffer, BufferClosed

__all__ = ["AheadBatch", "AheadSampler", "AHEAD_TIMEOUT_S", "snapshot"]

AHEAD_TIMEOUT_S = 1800.0  # one step's generation of a large model can take minutes; forever is never right
ERROR_GRACE_S = 5.0  # how long a trainer that timed out waits for the producer's own error


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A detached copy of the module's state dict: the weights of one policy version."""
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


@dataclass
class AheadBatch:
    step: int        # 0-based training step the batch is for
    version: int     # policy updates behind the weights that sampled it
    groups: Any      # what `sample(step)` returned
    generate_s: float


class AheadSampler:
    """Producer thread sampling steps first_step .. last_step - 1, step t with policy version max(0, t - s).

    load: load(weights) puts one published version (a dict of tensors, as `publish` received it) into the
        sampler, in the thread; called only when the version changes (the HF engine: load_state_dict into its
        own copy of the model; a vLLM engine: load_weights). With versioned_load, load(weights, version).
    sample: sample(step) -> groups, run in the thread after `load` gave the sampler that step's version.
    """

    def __init__(self, load: Callable[[dict[str, torch.Tensor]], Any], sample: Callable[[int], Any], *,
                 first_step: int, last_step: int, max_staleness: int, timeout_s: float = AHEAD_TIMEOUT_S,
                 versioned_load: bool = False) -> None:
        if max_staleness < 1:
            raise ValueError(f"max_staleness must be >= 1 for sampling ahead, got {max_staleness}")
        self.load, self.sample, self.s = load, sample, max_staleness
        self.first_step, self.last_step, self.timeout_s = first_step, last_step, timeout_s
        self.versioned_load = versioned_load
        self.buffer: BoundedBuffer[AheadBatch] = BoundedBuffer(max_staleness + 1, max_staleness=max_staleness)
        self._snapshots: dict[int, dict[str, torch.Tensor]] = {}
        self._cond = threading.Condition()
        self._stop = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="rlvr-ahead-sampler", daemon=True)

    def version_for(self, step: int) -> int:
        return max(0, step - self.s)

    # ---- trainer side ----------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def publish(self, version: int, weights: dict[str, torch.Tensor]) -> None:
        """The policy's weights after `version` updates. Versions older than version - s are dropped:
        neither the producer (its next step is >= the trainer's) nor a checkpoint at `version` needs them."""
        with self._cond:
            self._snapshots[version] = weights
            for v in [v for v in self._snapshots if v < version - self.s]:
                del self._snapshots[v]
            self._cond.notify_all()
        self.buffer.set_version(version)

    def for_checkpoint(self, step: int) -> dict[int, dict[str, torch.Tensor]]:
        """The versions before `step` that the steps after a resume at `step` will sample with."""
        with self._cond:
            return {v: w for v, w in self._snapshots.items() if self.version_for(step) <= v < step}

    def take(self, step: int) -> tuple[AheadBatch, float]:
        """Step `step`'s batch and the seconds the trainer waited for it."""
        t0 = time.perf_counter()
        try:
            batch = self.buffer.get(timeout=self.timeout_s)
        except (BufferClosed, TimeoutError) as e:
            # The producer may be failing at this very moment (its own wait timed out too): give it a moment to
            # record why, so the trainer hears the cause rather than "buffer empty".
            if self._thread.is_alive():
                self._thread.join(timeout=ERROR_GRACE_S)
            if isinstance(self._error, GuardError):  # a guard in the producer stops the run as in the trainer
                raise self._error
            if self._error is not None:
                raise RuntimeError(f"the ahead sampler failed before step {step + 1}: {self._error!r}") from self._error
            raise RuntimeError(f"no rollout batch for step {step + 1}: {e}") from e
        if batch.step != step:  # a logic error, not a data one: never train on another step's rollouts
            raise RuntimeError(f"ahead sampler delivered step {batch.step + 1}'s batch for step {step + 1}")
        return batch, time.perf_counter() - t0

    def close(self) -> None:
        """Stop the producer (also mid-run, when the trainer fails) and wait for it."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self.buffer.close()
        if self._thread.is_alive():
            self._thread.join(timeout=self.timeout_s)

    # ---- producer thread -------------------------------------------------------------------------
    def _weights(self, version: int) -> dict[str, torch.Tensor] | None:
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            while version not in self._snapshots and not self._stop:
                # Versions arrive in order: one older than the newest will never come (a resume without it).
                if self._snapshots and version < max(self._snapshots):
                    raise LookupError(f"policy version {version} is needed but was never published (have "
                                      f"{sorted(self._snapshots)})")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"policy version {version} was not published within {self.timeout_s:g}s")
                self._cond.wait(left)
            return None if self._stop else self._snapshots[version]

    def _run(self) -> None:
        loaded = None
        try:
            for step in range(self.first_step, self.last_step):
                version = self.version_for(step)
                weights = self._weights(version)
                if weights is None:
                    return
                if version != loaded:
                    if self.versioned_load:
                        self.load(weights, version)
                    else:
                        self.load(weights)
                    loaded = version
                t0 = time.perf_counter()
                groups = self.sample(step)
                self.buffer.put(AheadBatch(step, version, groups, time.perf_counter() - t0), version=version,
                                timeout=self.timeout_s)
            self.buffer.close()
        except BufferClosed:
            return  # the trainer closed the stream
        except BaseException as e:  # noqa: BLE001  (handed to the trainer, which raises it)
            self._error = e
            self.buffer.close()
