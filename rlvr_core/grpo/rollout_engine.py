"""The rollout-engine seam: the one object through which the GRPO trainer samples, so the engine is swappable.

The trainer never builds a sampling engine itself. It calls `make_rollout_engine(name, ...)` once (after
DeepSpeed has initialised, so the process group exists) and from then on talks to the `RolloutEngine` it
got back:

  * `sampler`: a `rlvr_core.sampling` engine (`generate(prompts, prompt_ids, params, *, step, epoch,
    first_sample_index) -> list[list[Sample]]`) that also has `pad_token_id` and `add_special_tokens`: the
    trainer re-tokenizes each prompt with the engine's own flag and pads with its pad id.
  * on-policy (max_staleness 0): `sync(module)` before every step's rollout, with the module the trainer
    samples: the policy itself (under ZeRO-3 the partitioned policy, whose full weights exist only gathered),
    or the plain replica the trainer has just filled from the partitions (`zero3_sampling_replica`; a
    collective, every rank calls it). An engine with its own weights (vLLM) copies them in here (gathering a
    partitioned module's weights first: every rank calls sync); the HF engine samples that very module, in
    lockstep across ranks when it is partitioned, so it has nothing to do.
  * bounded staleness (max_staleness > 0, ahead.py): after every update the trainer publishes
    `snapshot(module)`, one policy version in the form `load` takes; the ahead sampler's thread calls
    `load(weights)` to put the version a step needs into the sampler before sampling it. `load` runs in that
    thread, concurrently with training, so it must not touch the trained module or run a collective.
  * `close()` when the stage ends (also on failure).

Engines are the "rollout_engine" kind of the project's one registry (rlvr_core/core/registry.py lists their
names; each builder below registers itself: builder(**make_rollout_engine's keyword arguments) ->
RolloutEngine); `train_grpo(..., engine="hf")` picks one. "hf" is
`HFRolloutEngine`: transformers generate on the trainer's own module. "vllm" is `VLLMRolloutEngine`
(vllm_rollout.py): an in-process vLLM engine per rank into which `sync`/`load` push the weights.
"vllm-server" is `VLLMServerRolloutEngine` (server_rollout.py): `vllm serve` processes into which rank 0
pushes each version over HTTP. An engine with `versioned = True` gets the version number too:
`sync(module, version)` and `load(weights, version)`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Protocol, runtime_checkable

import torch

from rlvr_core.core.registry import ROLLOUT_ENGINES, register
from rlvr_core.experiment.config import GRPOConfig
from rlvr_core.grpo.ahead import snapshot as _snapshot
from rlvr_core.grpo.server_rollout import build_server_rollout_engine
from rlvr_core.grpo.vllm_rollout import VLLMRolloutEngine
from rlvr_core.sampling.base import SamplingEngine
from rlvr_core.sampling.hf import HFEngine

__all__ = ["RolloutEngine", "HFRolloutEngine", "make_rollout_engine", "known_rollout_engines",
           "check_rollout_engine"]


@runtime_checkable
class RolloutEngine(Protocol):
    # .generate(prompts, prompt_ids, params, *, step, epoch, first_sample_index) -> list[list[Sample]],
    # plus .pad_token_id and .add_special_tokens (the trainer re-tokenizes prompts as the engine did)
    sampler: SamplingEngine

    def sync(self, module: torch.nn.Module) -> None:
        """On-policy path: called before every on-policy rollout with the module holding the policy's current
        full weights (the policy, or the ZeRO-3 replica). Afterwards `sampler` samples those weights."""
        ...

    def snapshot(self, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        """Staleness path: one policy version (the module's current weights, copied), in the form `load` takes."""
        ...

    def load(self, weights: dict[str, torch.Tensor]) -> None:
        """Staleness path, called in the ahead sampler's thread: make `sampler` sample with that version."""
        ...

    def close(self) -> None:
        ...


class HFRolloutEngine:
    """The transformers engine (`rlvr_core.sampling.hf.HFEngine`, rollout_batch_size sequences per decode batch)
    on a module of this process.

    The sampled module is the trainer's own: the live policy (the tensors DeepSpeed updates), or under ZeRO-3
    the plain replica the trainer refreshes from the partitions, so `sync` has nothing to copy. With
    max_staleness > 0 it is a copy the engine owns (`own_copy`), which `load` fills with each published
    version (load_state_dict), so sampling ahead in a thread never touches the trained module.
    """

    name = "hf"

    def __init__(self, model: torch.nn.Module, tokenizer: Any, *, batch_size: int, device: torch.device | str,
                 lockstep: Callable[[int], int] | None = None, compile: bool | None = False):
        self.model = model
        self.samples_policy = lockstep is not None  # the partitioned policy itself, in lockstep across ranks
        self.sampler = HFEngine(model, tokenizer, batch_size=batch_size, device=device, lockstep=lockstep,
                                compile=compile)

    @classmethod
    def for_trainer(cls, *, policy: torch.nn.Module, replica: torch.nn.Module | None, tokenizer: Any,
                    cfg: GRPOConfig, device: torch.device, own_copy: Callable[[], torch.nn.Module],
                    lockstep: Callable[[int], int] | None = None, engine_options: dict | None = None,
                    **_: Any) -> "HFRolloutEngine":
        """lockstep: given when the policy is ZeRO-3 partitioned and there is no replica (n -> max over ranks);
        the engine then samples the partitioned policy with every rank in step (rlvr_core/sampling/hf.py)."""
        if cfg.max_staleness:
            # A fresh module, not copy.deepcopy(policy): DeepSpeed has hooked the policy, and those hooks hold
            # its engine (a deepcopy would copy the optimizer). Its weights do not matter: `load` fills it with
            # the published version before anything is sampled.
            dtype = next(policy.parameters()).dtype  # sample in the precision that trains
            model = own_copy().eval().requires_grad_(False).to(device, dtype)
            lockstep = None  # the engine's own plain copy: nothing collective in its forward
        else:
            model = replica if replica is not None else policy
        # The graphed decode step (sampling.hf_compile; None = auto) by default only on a plain module: dynamo
        # would trace the forward hooks DeepSpeed puts on the policy itself.
        compile = (engine_options or {}).get("hf_compile")
        if compile is None:
            compile = torch.device(device).type == "cuda" and model is not policy and lockstep is None
        return cls(model, tokenizer, batch_size=cfg.rollout_batch_size, device=device, lockstep=lockstep,
                   compile=compile)

    def sync(self, module: torch.nn.Module) -> None:
        if module is not self.model:  # the trainer's module *is* the sampled one; anything else is a wiring bug
            raise RuntimeError("HFRolloutEngine.sync got a module other than the one it samples")

    def snapshot(self, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        return _snapshot(module)

    def load(self, weights: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            self.model.load_state_dict(weights)

    def close(self) -> None:
        pass


register("rollout_engine", "hf")(HFRolloutEngine.for_trainer)


@register("rollout_engine", "vllm")
def _vllm_for_trainer(*, base_model_dir: str | Path, tokenizer: Any, cfg: GRPOConfig, seed: int,
                      engine_options: dict | None = None, **_: Any) -> RolloutEngine:
    """A colocated vLLM engine per rank (vllm_rollout.py), sampling in the precision that trains."""
    options = {"dtype": {"bf16": "bfloat16", "fp16": "float16"}.get(cfg.precision, "float32"), "seed": seed, **(engine_options or {})}
    return VLLMRolloutEngine(base_model_dir, tokenizer, **options)


@register("rollout_engine", "vllm-server")
def _server_for_trainer(*, base_model_dir: str | Path, tokenizer: Any, engine_options: dict | None = None,
                        **_: Any) -> RolloutEngine:
    """`vllm serve` processes (server_rollout.py): engine_options holds `servers` or `launch`, `push` (the
    `sampling.push` section) and `request_timeout_s`; the trainer adds `out_dir`, its output folder (a file
    push without a folder writes there)."""
    opts = dict(engine_options or {})
    out_dir = opts.pop("out_dir", None) or "."
    return build_server_rollout_engine(base_model_dir=base_model_dir, tokenizer=tokenizer, out_dir=out_dir,
                                       rank=int(os.environ.get("RANK", "0")), **opts)


def known_rollout_engines() -> list[str]:
    return ROLLOUT_ENGINES.names()


def check_rollout_engine(name: str) -> None:
    """Refuse an unknown engine name before any work is done."""
    if name not in ROLLOUT_ENGINES.names():
        raise ValueError(f"unknown rollout engine {name!r}: known engines are {known_rollout_engines()}")


def make_rollout_engine(name: str, *, base_model_dir: str | Path, tokenizer: Any, cfg: GRPOConfig,
                        device: torch.device, seed: int, policy: torch.nn.Module,
                        replica: torch.nn.Module | None,
                        own_copy: Callable[[], torch.nn.Module],
                        engine_options: dict | None = None,
                        lockstep: Callable[[int], int] | None = None) -> RolloutEngine:
    """The rollout engine `name` for a trainer whose DeepSpeed engine is initialised.

    base_model_dir: the model the policy started from; tokenizer: the trainer's; cfg: the stage's config
    (rollout_batch_size, max_staleness, precision, lora_*); device: this rank's device; seed: the run's seed;
    policy: the trained module (`engine.module`); replica: the ZeRO-3 plain copy the trainer refreshes, or
    None; own_copy(): a fresh plain module shaped like the policy (base model, LoRA-wrapped when LoRA is on),
    for an engine that samples its own copy; engine_options: engine-specific settings (vllm: `vllm.LLM`
    overrides such as kv_cache_memory_bytes or gpu_memory_utilization); lockstep: n -> max of n over the ranks,
    given when `policy` is ZeRO-3 partitioned without a replica (an engine that samples it must keep every
    rank's forward calls in step; one with weights of its own ignores it). Raises ValueError for an unknown
    name.
    """
    check_rollout_engine(name)
    return ROLLOUT_ENGINES.get(name)(base_model_dir=base_model_dir, tokenizer=tokenizer, cfg=cfg, device=device, seed=seed,
                           policy=policy, replica=replica, own_copy=own_copy, engine_options=engine_options,
                           lockstep=lockstep)
