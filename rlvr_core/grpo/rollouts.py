"""Rollout collection for the GRPO trainer: which prompts a step samples, how, and which groups it trains.

`RolloutCollector.collect(step, data_pos)` returns a `RolloutBatch`: this rank's groups (prompt, samples,
verifier outcomes) plus, gathered from every rank, the numbers of every group the step sampled
(`GroupStats`: rewards, overlong penalties, unique fraction, generated tokens, truncations, status counts),
and the groups it trains (`selected`). Every decision below is taken from the gathered numbers, so every
rank agrees on the rounds and on the kept groups, and issues the same collectives.

  * prompts: round k of a step samples the P curriculum prompts at positions data_pos + k*P ... (cycled;
    epoch = position // len), each rank its contiguous share (distributed.py). One gather of GroupStats per
    round. Without dynamic sampling there is exactly one round and every group is kept.
  * on-policy (max_staleness 0): the rollout engine (rollout_engine.py) is synced with the policy's current
    weights, then samples G completions per prompt with the template's stop strings and per-request seeds
    derived from (seed, prompt id, epoch, step, sample index) (G-fixed-seed). The engine returns each
    sampled token's RAW (temperature-1) log-prob: the old log-probs.
  * adaptive sampling: every prompt gets a first chunk of G; those that lack adaptive_k_success correct or
    adaptive_k_failure incorrect completions get further chunks (sample indices continuing where the last
    chunk ended, so the seeds are those of one larger call) until they have them or reach
    adaptive_max_samples. The chunk loop is this rank's own: no collective runs inside it, so ranks may
    loop different numbers of times. Groups then differ in size (at most M = adaptive_max_samples).
  * reward: VerifierPool scores each completion against the gold (`gold_of`); with `overlong_buffer_len` the
    DAPO soft overlong penalty of each completion's length is kept beside it (added before advantages).
  * DAPO dynamic sampling: groups whose (shaped) rewards are all equal are dropped and rounds of the next P
    prompts are sampled until P groups are kept or `dynamic_sampling_max_rounds` is reached (the batch is
    then trained short, G-partial-batch). A round may sample a prompt twice in a step (rounds run past the
    curriculum's end): each prompt's seed gets the epoch of its own position, so no two requests share one.
  * bounded staleness (max_staleness s > 0): step t's groups were sampled ahead, in the ahead sampler's
    thread (ahead.py), with the policy after max(0, t - s) updates; `collect` takes them (the wait is the
    rollout time) and verifies them. Same prompts, seeds and engine call as the on-policy path.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable

import torch

from rlvr_core.data import gold_of
from rlvr_core.experiment.config import GRPOConfig
from rlvr_core.grpo.advantages import overlong_penalty
from rlvr_core.grpo.ahead import AheadSampler
from rlvr_core.grpo.distributed import DataParallel
from rlvr_core.grpo.rollout_engine import RolloutEngine
from rlvr_core.grpo.sampling_strategies import AdaptiveSamplingState, filter_zero_variance_groups
from rlvr_core.sampling.base import Sample, SamplingParams, unique_fraction

__all__ = ["STATUSES", "GroupStats", "RolloutGroup", "RolloutBatch", "RolloutCollector", "gold_of"]

STATUSES = ("correct", "incorrect", "no_answer", "error", "timeout")  # verifiers.base.Status values




@dataclass(frozen=True)
class GroupStats:
    """What every rank knows of one group sampled this step (gathered from the rank that sampled it)."""

    rewards: tuple[float, ...]    # verifier reward of each completion
    penalties: tuple[float, ...]  # DAPO overlong penalty of each completion (<= 0; 0.0 when the option is off)
    unique_frac: float            # distinct texts / completions
    gen_tokens: int               # generated tokens, all completions
    truncations: int              # completions that hit max_new_tokens
    statuses: tuple[int, ...]     # verifier status counts, in STATUSES order

    @property
    def size(self) -> int:
        return len(self.rewards)

    @property
    def n_correct(self) -> int:
        return self.statuses[STATUSES.index("correct")]


@dataclass
class RolloutGroup:
    """One prompt's completions, held by the rank that sampled them."""

    index: int              # step-wide group index: round * P + slot
    position: int           # curriculum position of the prompt
    row: dict               # the training row (id, question, gold)
    prompt: str             # the rendered prompt the engine saw
    samples: list[Sample]
    outcomes: list[Any]     # verifier Outcome per sample
    stats: GroupStats


def _padded(values: list[tuple[float, ...]], width: int) -> torch.Tensor:
    """(len(values), width) float32, NaN past each row's length."""
    rows = [list(v) + [math.nan] * (width - len(v)) for v in values]
    return torch.tensor(rows, dtype=torch.float32).reshape(len(rows), width)


@dataclass
class RolloutBatch:
    """One step's rollouts. Groups are numbered step-wide (round * P + slot) in sampling order."""

    local: dict[int, RolloutGroup]  # this rank's groups, by step-wide index
    stats: list[GroupStats]         # every group sampled this step (all rounds, all ranks), by step-wide index
    selected: list[int]             # step-wide indices of the trained groups, in sampling order (K <= P)
    rounds: int                     # rollout rounds (1 without dynamic sampling)
    dropped: int                    # zero-variance groups dropped by dynamic sampling
    width: int                      # M: the most completions one group can have (the padding width)
    t_rollout_s: float              # generation (or the wait for the ahead sampler) and the weight sync
    version: int | None = None      # with the ahead sampler: policy updates behind the weights that sampled
    generate_s: float | None = None  # with the ahead sampler: its generation time for this step
    push_s: float = 0.0             # on-policy: the weight sync into the engine (part of t_rollout_s)
    stale: dict[str, int] | None = None  # vllm-server: stale groups dropped and refilled (async/* columns)
    env: dict[str, float] | None = None  # a multi-turn environment's env/* columns (this rank's trajectories)
    trajectories: list | None = None  # (prompt id, sample index, Trajectory) of this rank's rollouts, multi-turn

    @property
    def K(self) -> int:
        return len(self.selected)

    @property
    def n_groups(self) -> int:  # prompts consumed: every prompt sampled, kept or not
        return len(self.stats)

    @cached_property
    def rewards(self) -> torch.Tensor:  # (n_groups, M) verifier rewards, NaN-padded
        return _padded([s.rewards for s in self.stats], self.width)

    @cached_property
    def penalties(self) -> torch.Tensor:  # (n_groups, M) overlong penalties, NaN-padded
        return _padded([s.penalties for s in self.stats], self.width)

    @cached_property
    def valid(self) -> torch.Tensor:  # (n_groups, M): which slots hold a completion
        return torch.isfinite(self.rewards)

    @cached_property
    def sizes(self) -> torch.Tensor:  # completions per group: G, or more under adaptive sampling
        return self.valid.sum(1)

    def mine(self) -> list[tuple[int, RolloutGroup]]:
        """(j, group) for the trained groups this rank holds; j = the group's row among the K trained."""
        return [(j, self.local[g]) for j, g in enumerate(self.selected) if g in self.local]

    def zero_var_share(self) -> float:
        """Share of the step's groups whose verifier rewards are all equal (no learning signal)."""
        return float((~filter_zero_variance_groups(self.rewards).keep_groups).float().mean())

    def status_counts(self) -> dict[str, int]:
        return {st: sum(s.statuses[i] for s in self.stats) for i, st in enumerate(STATUSES)}


class RolloutCollector:
    """Samples and verifies each step's prompts on this rank (see the module docstring).

    weights(): the module the trainer samples (collective with a ZeRO-3 replica), for `engine.sync` before
    each on-policy rollout. lockstep: the engine samples the ZeRO-3 partitioned policy, whose forward is a
    collective, so every rank must make the same number of engine calls: adaptive sampling's rounds go on
    until no rank has a prompt left, and the calls per round are padded to the busiest rank's with empty
    calls (the engine then runs dummy batches).
    """

    def __init__(self, cfg: GRPOConfig, *, rows: list[dict], template: Any, engine: RolloutEngine, pool: Any,
                 dp: DataParallel, max_new_tokens: int, seed: int, weights: Callable[[], torch.nn.Module],
                 timeout_reward: float = 0.0, lockstep: bool = False):
        self.lockstep = lockstep
        self.cfg, self.rows, self.template, self.engine, self.pool, self.dp = cfg, rows, template, engine, pool, dp
        self.timeout_reward = timeout_reward  # what a completion whose verification timed out scores
        self.P, self.G, self.L = cfg.prompts_per_step, cfg.group_size, len(rows)
        self.M = cfg.adaptive_max_samples if cfg.adaptive_sampling else self.G
        self.max_new_tokens, self.weights = max_new_tokens, weights
        self.params = SamplingParams(n=self.G, temperature=cfg.temperature, top_p=cfg.top_p,
                                     max_new_tokens=max_new_tokens, stop=template.stop, seed=seed)
        self.shard = list(range(self.P))[dp.shard(self.P)]  # this rank's prompt slots in every round
        self.ahead: AheadSampler | None = None
        self._first_pos = self._first_step = 0
        self._put_wait = 0.0

    # ---- one step ---------------------------------------------------------------------------------
    def collect(self, step: int, data_pos: int) -> RolloutBatch:
        t0 = time.perf_counter()
        if self.ahead is None:  # ZeRO-3: refresh the sampling copy before it samples
            if getattr(self.engine, "versioned", False):
                self.engine.sync(self.weights(), version=step)
            else:
                self.engine.sync(self.weights())
        P, epoch = self.P, data_pos // self.L
        max_rounds = self.cfg.dynamic_sampling_max_rounds if self.cfg.dynamic_sampling else 1
        local: dict[int, RolloutGroup] = {}
        stats: list[GroupStats] = []
        selected: list[int] = []
        rounds = dropped = 0
        taken: dict[str, Any] = {}
        t_roll = push_s = time.perf_counter() - t0  # the weight sync (ZeRO-3 gather, vLLM push) is rollout time
        while rounds < max_rounds and len(selected) < P:
            positions = [data_pos + rounds * P + i for i in self.shard]
            my_rows = [self.rows[q % self.L] for q in positions]
            prompts = [self.template.render(r["question"]) for r in my_rows]
            groups, outs, t_gen = self._sample(positions, my_rows, prompts, step, epoch, taken)
            t_roll += t_gen
            mine = [RolloutGroup(rounds * P + self.shard[k], positions[k], r, prompts[k], g, o, self._stats(g, o))
                    for k, (r, g, o) in enumerate(zip(my_rows, groups, outs))]
            local.update((g.index, g) for g in mine)
            got = self.dp.gather_objects([g.stats for g in mine])  # the round's P groups, on every rank
            stats += got
            keep = self._keep(got)
            dropped += keep.count(False)
            selected += [rounds * P + i for i in range(P) if keep[i]][:P - len(selected)]
            rounds += 1
        stale = getattr(self.engine, "stale_columns", None)
        trajectories = self._trajectories()
        return RolloutBatch(local, stats, selected, rounds, dropped, self.M, t_roll, taken.get("version"),
                            taken.get("generate_s"), push_s, stale(step) if stale else None,
                            self.engine.sampler.health([t for _, _, t in trajectories]) if trajectories else None,
                            trajectories)

    def _trajectories(self) -> list | None:
        """The step's multi-turn trajectories, when the sampler runs an environment (environment_engine.py)."""
        take = getattr(self.engine.sampler, "take", None)
        return take() if take is not None else None

    def _stats(self, samples: list[Sample], outcomes: list[Any]) -> GroupStats:
        cfg = self.cfg
        if cfg.overlong_buffer_len > 0:
            pen = overlong_penalty(torch.tensor([len(x.token_ids) for x in samples]), self.max_new_tokens,
                                   cfg.overlong_buffer_len, cfg.overlong_penalty_factor).tolist()
        else:
            pen = [0.0] * len(samples)
        rewards = tuple(self.timeout_reward if o.status.value == "timeout" else float(o.reward) for o in outcomes)
        return GroupStats(rewards=rewards, penalties=tuple(pen),
                          unique_frac=unique_fraction(samples), gen_tokens=sum(len(x.token_ids) for x in samples),
                          truncations=sum(x.finish_reason == "length" for x in samples),
                          statuses=tuple(sum(o.status.value == st for o in outcomes) for st in STATUSES))

    def _keep(self, got: list[GroupStats]) -> list[bool]:
        """Which of a round's P groups are kept: all, or (DAPO) those whose shaped rewards are not all equal
        (a group whose rewards are all equal has advantage 0 everywhere)."""
        if not self.cfg.dynamic_sampling:
            return [True] * len(got)
        shaped = _padded([s.rewards for s in got], self.M)
        if self.cfg.overlong_buffer_len > 0:
            shaped = shaped + _padded([s.penalties for s in got], self.M)
        return filter_zero_variance_groups(shaped).keep_groups.tolist()

    # ---- sampling -----------------------------------------------------------------------------------
    def _sample(self, positions: list[int], my_rows: list[dict], prompts: list[str], step: int, epoch: int,
                taken: dict) -> tuple[list[list[Sample]], list[list[Any]], float]:
        """Sample and verify this rank's prompts: (groups, their verifier outcomes, seconds generating); with
        the ahead sampler, its batch for `step` (recorded in `taken`) and the seconds waited for it."""
        ids = [r["id"] for r in my_rows]
        golds = [gold_of(r) for r in my_rows]
        if self.ahead is not None:
            batch, waited = self.ahead.take(step)
            if [g[0].prompt_id for g in batch.groups] != ids:  # golds below are looked up by these rows
                raise RuntimeError(f"step {step + 1}: the ahead sampler sampled other prompts than the trainer's")
            taken.update(version=batch.version, generate_s=batch.generate_s)
            flat = self.pool.verify_many([(x.text, gold) for gold, g in zip(golds, batch.groups) for x in g])
            return batch.groups, [flat[k * self.G:(k + 1) * self.G] for k in range(len(golds))], waited
        return self._sample_chunks(positions, prompts, ids, golds, step, epoch)

    def _sample_chunks(self, positions: list[int], prompts: list[str], ids: list[str], golds: list[Any],
                       step: int, epoch: int) -> tuple[list[list[Sample]], list[list[Any]], float]:
        """On-policy: one chunk of G per prompt, and with adaptive sampling further chunks until enough."""
        cfg, G = self.cfg, self.G
        groups: list[list] = [[] for _ in ids]
        outs: list[list] = [[] for _ in ids]
        states = [AdaptiveSamplingState(cfg.adaptive_k_success, cfg.adaptive_k_failure, self.M, G) for _ in ids]
        t_gen = 0.0
        while True:
            # Pending prompts all hold the same number of samples (equal chunks so far), so one call serves them.
            todo = [k for k, st in enumerate(states) if st.n == 0 or (cfg.adaptive_sampling and not st.done)]
            if not (self.dp.max([float(bool(todo))])[0] if self.lockstep else todo):
                return groups, outs, t_gen
            if not todo:  # lockstep: done here, not on another rank; join its engine calls
                self._generate([], [], [], step, epoch, self.params)
                continue
            first = states[todo[0]].n
            n = G if first == 0 else states[todo[0]].next_chunk()
            tg = time.perf_counter()
            new = self._generate([positions[k] for k in todo], [prompts[k] for k in todo], [ids[k] for k in todo],
                                 step, epoch, self.params if n == G else dataclasses.replace(self.params, n=n), first)
            t_gen += time.perf_counter() - tg
            verified = self.pool.verify_many([(x.text, golds[k]) for k, g in zip(todo, new) for x in g])
            for i, (k, g) in enumerate(zip(todo, new)):
                got = verified[i * n:(i + 1) * n]
                groups[k] += g
                outs[k] += got
                states[k] = states[k].observe(o.status.value == "correct" for o in got)

    def _generate(self, positions: list[int], prompts: list[str], ids: list[str], step: int, epoch: int,
                  chunk: SamplingParams, first: int = 0) -> list[list[Sample]]:
        generate = self.engine.sampler.generate
        if not self.cfg.dynamic_sampling:
            return generate(prompts, ids, chunk, step=step, epoch=epoch, first_sample_index=first)
        # Dynamic sampling may sample one prompt twice in a step (rounds run past the curriculum's end):
        # each prompt's seed gets the epoch of its own position, so (prompt id, epoch) names the position
        # and no two requests of a step share a seed. One engine call per epoch segment.
        out: list = []
        i = calls = 0
        while i < len(positions):
            j = i
            while j < len(positions) and positions[j] // self.L == positions[i] // self.L:
                j += 1
            out += generate(prompts[i:j], ids[i:j], chunk, step=step, epoch=positions[i] // self.L,
                            first_sample_index=first)
            i, calls = j, calls + 1
        if self.lockstep:  # a segment boundary may fall in one rank's share only: as many calls on every rank
            for _ in range(int(self.dp.max([float(calls)])[0]) - calls):
                generate([], [], chunk, step=step, epoch=epoch, first_sample_index=first)
        return out

    # ---- bounded staleness ------------------------------------------------------------------------
    def start_ahead(self, *, first_step: int, last_step: int, data_pos: int,
                    saved: dict[int, dict[str, torch.Tensor]], current: dict[str, torch.Tensor]) -> AheadSampler:
        """Start the ahead sampler for steps first_step .. last_step - 1 (data position `data_pos` at
        first_step), after publishing `saved` (a resume: the versions before it) and `current` (version
        first_step). It loads versions into the rollout engine (`engine.load`)."""
        self._first_pos, self._first_step = data_pos, first_step
        ahead = AheadSampler(self.engine.load, self._sample_ahead, first_step=first_step, last_step=last_step,
                             max_staleness=self.cfg.max_staleness,
                             versioned_load=getattr(self.engine, "versioned", False))
        for v in sorted(saved):  # a resume: the versions before it, then its own
            ahead.publish(int(v), saved[v])
        ahead.publish(first_step, current)
        ahead.start()
        self.ahead = ahead
        return ahead

    def _sample_ahead(self, step: int) -> list:
        """Step `step`'s groups, in the ahead sampler's thread (no dynamic sampling: step t starts at t * P
        from where the sampler started). Same prompts, seeds and engine call as the on-policy path."""
        pos = self._first_pos + (step - self._first_step) * self.P
        my_rows = [self.rows[(pos + i) % self.L] for i in self.shard]
        return self.engine.sampler.generate([self.template.render(r["question"]) for r in my_rows],
                                            [r["id"] for r in my_rows], self.params, step=step, epoch=pos // self.L)

    def buffer_columns(self) -> dict[str, float]:
        """The ahead buffer's state for the step row: size, evictions (cumulative), and the time the producer
        was held back by a full buffer since the last call."""
        buf = self.ahead.buffer.stats()
        cols = {"buffer/size": buf["size"], "buffer/evicted": buf["evicted"],
                "buffer/put_wait_s": buf["put_wait_s"] - self._put_wait}
        self._put_wait = buf["put_wait_s"]
        return cols

    def close(self) -> None:
        if self.ahead is not None:
            self.ahead.close()
