"""Rollouts from `vllm serve` processes (`engine="vllm-server"`), with versioned weight pushes from rank 0.

Generation runs in separate server processes (`rlvr_core/sampling/vllm_server.py`); the trainer pushes every
policy version it samples with through vLLM's weight-transfer routes, labelled with its version number (the
optimizer steps behind it). On-policy (`max_staleness` 0) step t pushes version t before its rollout; with
staleness s the ahead sampler's thread pushes version max(0, t - s) before sampling step t, so the servers
generate step t + s while the trainer trains step t (ahead.py).

G-weight-push: the servers label every sampled token with the version they held. A sample whose version is
not the one the trainer pushed for it (a push that was skipped, lost or only half applied) stops the run
with a GuardError naming the server's version and the expected one; a push that fails or times out is a
ServerError naming the server. Under several ranks only rank 0 pushes; the others wait (bounded) until
every server reports the version before they sample.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from rlvr_core.experiment.guards import GuardError
from rlvr_core.grpo.vllm_rollout import _gathered, engine_weights
from rlvr_core.sampling.base import Sample
from rlvr_core.sampling.vllm_server import ServerError, VLLMServerEngine
from rlvr_core.sampling.vllm_server_launch import launch_servers

__all__ = ["VLLMServerRolloutEngine", "check_sample_versions", "GUARD_WEIGHT_PUSH"]

GUARD_WEIGHT_PUSH = "G-weight-push"


def check_sample_versions(groups: list[list[Sample]], expected: int, server_urls: list[str]) -> None:
    """GuardError (G-weight-push) when a sample was not produced by weight version `expected`."""
    bad = [(s.prompt_id, s.sample_index, s.weight_version) for g in groups for s in g if s.weight_version != expected]
    if bad:
        pid, idx, got = bad[0]
        raise GuardError(f"{GUARD_WEIGHT_PUSH}: {len(bad)} samples were not sampled with weight version {expected} "
                         f"(e.g. {pid!r}/{idx} by version {got}) on {', '.join(server_urls)}: a weight push was "
                         "skipped or failed")


class _CheckedSampler:
    """The server engine's `generate`, plus the version check of every sample it returns."""

    def __init__(self, engine: VLLMServerEngine, owner: "VLLMServerRolloutEngine"):
        self._engine, self._owner = engine, owner
        self.pad_token_id, self.add_special_tokens = engine.pad_token_id, engine.add_special_tokens

    def generate(self, prompts, prompt_ids, params, **kw) -> list[list[Sample]]:
        groups = self._engine.generate(prompts, prompt_ids, params, **kw)
        if self._owner.version is not None:
            check_sample_versions(groups, self._owner.version, [c.url for c in self._engine.clients])
        return groups


class VLLMServerRolloutEngine:
    """The trainer's rollout engine over vLLM servers (see the module docstring).

    sampler_engine: the HTTP engine (servers, push folder, timeouts). is_sender: rank 0 pushes; other ranks
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

    def sync(self, module: torch.nn.Module, version: int | None = None) -> None:
        """On-policy: make `version` (the policy's current weights) the servers'. Every rank calls it (a
        ZeRO-3 module is gathered collectively); rank 0 pushes."""
        with _gathered(module):
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
            self._wait_for(v)
        self.version = v
        self.pushes += 1
        self.push_s.append(time.perf_counter() - t0)

    def _wait_for(self, version: int) -> None:
        deadline = time.monotonic() + self.wait_timeout_s
        for c in self.server.clients:
            while c.weight_version() != str(version):
                if time.monotonic() > deadline:
                    raise ServerError(f"vLLM server {c.url}: weight version {version} not there within "
                                      f"{self.wait_timeout_s:g}s (rank 0 pushes it)")
                time.sleep(0.05)

    def close(self) -> None:
        self.server.close()
        for s in self.launched:
            s.stop()


def build_server_rollout_engine(*, base_model_dir: str | Path, tokenizer: Any, out_dir: str | Path, rank: int,
                                servers: list[str] | None = None, launch: dict | None = None,
                                request_timeout_s: float = 300.0, push_timeout_s: float = 120.0,
                                push_folder: str | Path | None = None,
                                push_backend: str = "rlvr_file") -> VLLMServerRolloutEngine:
    """The engine for a trainer: the given servers, or (rank 0 only) servers started here with `launch`
    (`count`, `start_timeout_s`, `threads`, `kv_cache_bytes`, `dtype`). push_backend: `rlvr_file` or `ipc`."""
    launched = []
    if not servers:
        if launch is None:
            raise ValueError("vllm-server needs sampling.servers or sampling.server_launch")
        if rank != 0:
            raise ValueError("servers started by rlvr (sampling.server_launch) need one trainer process; "
                             "give several ranks sampling.servers")
        opts = dict(launch)
        launched = launch_servers(base_model_dir, int(opts.pop("count", 1)), Path(out_dir) / "vllm-servers",
                                  push_backend=push_backend, **opts)
        servers = [s.url for s in launched]
    folder = Path(push_folder) if push_folder is not None else Path(out_dir) / "weight_push"
    try:
        engine = VLLMServerEngine(servers, base_model_dir, tokenizer=tokenizer, push_folder=folder,
                                  request_timeout_s=request_timeout_s, push_timeout_s=push_timeout_s,
                                  push_backend=push_backend)
    except BaseException:
        for s in launched:
            s.stop()
        raise
    return VLLMServerRolloutEngine(engine, is_sender=rank == 0, launched=launched)
