"""Rollouts from `vllm serve` processes (`engine="vllm-server"`), with versioned weight pushes from rank 0.

Generation runs in separate server processes (`rlvr_core/sampling/vllm_server.py`); the trainer pushes every
policy version it samples with through vLLM's weight-transfer routes, labelled with its version number (the
optimizer steps behind it). On-policy (`max_staleness` 0) step t pushes version t before its rollout; with
staleness s the ahead sampler's thread pushes version max(0, t - s) before sampling step t, so the servers
generate step t + s while the trainer trains step t (ahead.py).

G-weight-push and stale groups: the servers label every sampled token with the version they held. Step t's
groups must come from the version pushed for it (t on-policy, max(0, t - s) at staleness s: the window
t - s .. newest pushed is that one version here, since the ahead thread pushes before it samples). A group
with a sample older than that (its server missed a push, or still held the previous version) is stale: it is
dropped whole (GRPO's advantages need the whole group) and the same prompt is sampled again, same seeds, on
the servers whose groups were current, so the step keeps its P groups. Refilling instead of shrinking keeps
the batch, the loss normalisation, G-partial-batch and dynamic/adaptive sampling exactly as on one server,
and the refilled samples equal what a current server would have sampled in the first place. Dropped groups
are counted per step (`async/stale_groups_dropped`, `async/stale_lag_max`) and per run
(`async/stale_groups_total`). GuardError (G-weight-push): every group of a call is stale (no server holds
the pushed version: a push that was skipped or lost), a refilled group is stale again, or a sample's version
was never pushed (newer than the newest push, or unlabelled). A push that fails or times out is a
ServerError naming the server. Under several ranks only rank 0 pushes; the others wait (bounded) until
every server reports the version before they sample.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from rlvr_core.experiment.guards import GuardError
from rlvr_core.grpo.vllm_rollout import gathered_whole, engine_weights
from rlvr_core.sampling.base import Sample
from rlvr_core.experiment.push_config import push_config
from rlvr_core.sampling.vllm_server import VLLMServerEngine
from rlvr_core.sampling.vllm_server_launch import launch_servers
from rlvr_core.sampling.weight_push import wait_for_version

__all__ = ["VLLMServerRolloutEngine", "check_sample_versions", "split_stale", "GUARD_WEIGHT_PUSH"]

GUARD_WEIGHT_PUSH = "G-weight-push"


def split_stale(groups: list[list[Sample]], oldest: int, newest: int) -> tuple[list[int], list[int]]:
    """(accepted, stale) group indices: accepted when every sample's version v has oldest <= v <= newest,
    stale when a sample is older than `oldest`. GuardError (G-weight-push) for a version never pushed:
    newer than `newest`, or unlabelled (None)."""
    never = [(s.prompt_id, s.sample_index, s.weight_version) for g in groups for s in g
             if s.weight_version is None or s.weight_version > newest]
    if never:
        pid, idx, got = never[0]
        raise GuardError(f"{GUARD_WEIGHT_PUSH}: {len(never)} samples carry a weight version never pushed "
                         f"(e.g. {pid!r}/{idx} by version {got}; newest pushed {newest})", guard=GUARD_WEIGHT_PUSH)
    old = [any(s.weight_version < oldest for s in g) for g in groups]
    return [i for i, o in enumerate(old) if not o], [i for i, o in enumerate(old) if o]


def check_sample_versions(groups: list[list[Sample]], expected: int, server_urls: list[str]) -> None:
    """GuardError (G-weight-push) when a sample was not produced by weight version `expected`."""
    bad = [(s.prompt_id, s.sample_index, s.weight_version) for g in groups for s in g if s.weight_version != expected]
    if bad:
        pid, idx, got = bad[0]
        raise GuardError(f"{GUARD_WEIGHT_PUSH}: {len(bad)} samples were not sampled with weight version {expected} "
                         f"(e.g. {pid!r}/{idx} by version {got}) on {', '.join(server_urls)}: a weight push was "
                         "skipped or failed", guard=GUARD_WEIGHT_PUSH)


class _CheckedSampler:
    """The server engine's `generate` and `generate_ids` (a multi-turn environment's), plus the version check of
    every sample it returns and the refill of stale groups on the servers that were current (see the module
    docstring)."""

    def __init__(self, engine: VLLMServerEngine, owner: "VLLMServerRolloutEngine"):
        self._engine, self._owner = engine, owner
        self.tokenizer = engine.tokenizer
        self.pad_token_id, self.add_special_tokens = engine.pad_token_id, engine.add_special_tokens

    def generate(self, prompts, prompt_ids, params, **kw) -> list[list[Sample]]:
        return self._checked(self._engine.generate, prompts, prompt_ids, params, **kw)

    def generate_ids(self, prompt_token_ids, prompt_ids, params, **kw) -> list[list[Sample]]:
        return self._checked(self._engine.generate_ids, prompt_token_ids, prompt_ids, params, **kw)

    def _checked(self, call, prompts, prompt_ids, params, **kw) -> list[list[Sample]]:
        groups = call(prompts, prompt_ids, params, **kw)
        v, clients = self._owner.version, self._engine.clients
        if v is None:
            return groups
        accepted, stale = split_stale(groups, v, v)
        if not stale:
            return groups
        current = sorted({i % len(clients) for i in accepted})  # prompt i was sampled by server i mod n
        if not current:
            check_sample_versions(groups, v, [c.url for c in clients])
        redo = call([prompts[i] for i in stale], [prompt_ids[i] for i in stale], params,
                    clients=[clients[j] for j in current], **kw)
        check_sample_versions(redo, v, [clients[j].url for j in current])
        lag = max(v - s.weight_version for i in stale for s in groups[i])
        self._owner.count_stale(int(kw.get("step", 0)), len(stale), lag)
        for i, g in zip(stale, redo):
            groups[i] = g
        return groups


class VLLMServerRolloutEngine:
    """The trainer's rollout engine over vLLM servers (see the module docstring).

    sampler_engine: the HTTP engine (servers, weight-push transport, timeouts). is_sender: rank 0 pushes; other ranks
    wait for the servers to report each version. launched: servers this engine started, stopped by `close`.
    """

    name = "vllm-server"
    versioned = True  # sync/load take the version they make current

    def __init__(self, sampler_engine: VLLMServerEngine, *, is_sender: bool = True, launched: list | None = None,
                 wait_timeout_s: float = 300.0):
        self.server = sampler_engine
        self.sampler = _CheckedSampler(sampler_engine, self)
        self.is_sender, self.launched, self.wait_timeout_s = is_sender, list(launched or []), wait_timeout_s
        self.version: int | None = None  # the version the servers must hold now
        self.pushes = 0
        self.push_s: list[float] = []
        self.stale: dict[int, tuple[int, int]] = {}  # step -> (stale groups dropped, their largest version lag)
        self.stale_total = 0

    def count_stale(self, step: int, groups: int, lag: int) -> None:
        n, most = self.stale.get(step, (0, 0))
        self.stale[step] = (n + groups, max(most, lag))

    def stale_columns(self, step: int) -> dict[str, int]:
        """Step `step`'s stale-group columns (this rank's groups) and the run's total so far."""
        n, lag = self.stale.pop(step, (0, 0))
        self.stale_total += n
        return {"async/stale_groups_dropped": n, "async/stale_lag_max": lag,
                "async/stale_groups_total": self.stale_total}

    def sync(self, module: torch.nn.Module, version: int | None = None) -> None:
        """On-policy: make `version` (the policy's current weights) the servers'. Every rank calls it (a
        ZeRO-3 module is gathered collectively); rank 0 pushes."""
        with gathered_whole(module):
            weights = engine_weights(module) if self.is_sender else iter(())
            self._make_current(weights, version)

    def snapshot(self, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        return {k: v.detach().to("cpu", copy=True) for k, v in engine_weights(module)}

    def load(self, weights: dict[str, torch.Tensor], version: int | None = None) -> None:
        """Staleness path, in the ahead sampler's thread: push that version."""
        self._make_current(iter(weights.items()), version)

    def _make_current(self, weights, version: int | None) -> None:
        v = self.pushes if version is None else int(version)
        t0 = time.perf_counter()
        if self.is_sender:
            self.server.push_weights(weights, v)
        else:
            wait_for_version(self.server.clients, v, self.wait_timeout_s)
        self.version = v
        self.pushes += 1
        self.push_s.append(time.perf_counter() - t0)

    def close(self) -> None:
        self.server.close()
        for s in self.launched:
            s.stop()


def build_server_rollout_engine(*, base_model_dir: str | Path, tokenizer: Any, out_dir: str | Path, rank: int,
                                servers: list[str] | None = None, launch: dict | None = None,
                                request_timeout_s: float = 300.0, push: Any = None) -> VLLMServerRolloutEngine:
    """The engine for a trainer: the given servers, or (rank 0 only) servers started here with `launch`
    (`count`, `start_timeout_s`, `threads`, `kv_cache_bytes`, `dtype`). push: the `sampling.push` section (a
    config, mapping or type name; default `file`); a file push without a folder writes into out_dir/weight_push."""
    push = push_config(push)
    if push.type == "file" and push.folder is None:
        push = push.model_copy(update={"folder": str(Path(out_dir) / "weight_push")})
    launched = []
    if not servers:
        if launch is None:
            raise ValueError("vllm-server needs sampling.servers or sampling.server_launch")
        if rank != 0:
            raise ValueError("servers started by rlvr (sampling.server_launch) need one trainer process; "
                             "give several ranks sampling.servers")
        opts = dict(launch)
        launched = launch_servers(base_model_dir, int(opts.pop("count", 1)), Path(out_dir) / "vllm-servers",
                                  push=push, **opts)
        servers = [s.url for s in launched]
    try:
        engine = VLLMServerEngine(servers, base_model_dir, tokenizer=tokenizer, push=push,
                                  request_timeout_s=request_timeout_s)
    except BaseException:
        for s in launched:
            s.stop()
        raise
    return VLLMServerRolloutEngine(engine, is_sender=rank == 0, launched=launched)
