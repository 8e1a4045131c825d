"""`ipc`: vLLM's own CUDA IPC trainer engine over its HTTP control client, for servers on the trainer's GPU:
the weights stay on this process's GPU and the server maps them. One server at a time, then the version
label; the servers need `VLLM_ALLOW_INSECURE_SERIALIZATION=1` (the handles travel pickled over HTTP)."""

from __future__ import annotations

from typing import Any

from rlvr_core.sampling.vllm_client import ServerClient, ServerError
from rlvr_core.sampling.weight_push.base import Transport, label_version, pairs_source

__all__ = ["IpcTransport"]


class IpcTransport(Transport):
    type = "ipc"
    server_backend = "ipc"
    server_env = {"VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}  # servers listen on loopback only
    needs_cuda = True
    concurrent = False

    def prepare(self, weights, version: int):
        return [(k, v.detach().to("cuda").contiguous()) for k, v in weights]

    def send(self, client: ServerClient, payload: Any, version: int) -> None:
        import requests
        from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

        try:
            http = HTTPVLLMWeightSyncClient(client.url, timeout=client.push_timeout_s)
            WeightTransferTrainerFactory.trainer_init(IPCTrainerInitInfo(rank=0), client=http,
                                                      source=pairs_source(lambda: payload)).send_weights()
        except requests.RequestException as e:
            raise ServerError(f"vLLM server {client.url}: ipc weight push failed ({type(e).__name__}: {e})") from None
        label_version(client, version)

    def push(self, weights, version: int) -> None:
        import torch

        super().push(weights, version)
        torch.cuda.synchronize()
