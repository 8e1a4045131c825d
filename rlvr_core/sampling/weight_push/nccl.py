"""`nccl`: vLLM's own NCCL broadcast from the trainer's GPU into each server's workers on other GPUs (CUDA
only; the servers run vLLM's `nccl` weight-transfer backend). The group logic is collective.py's."""

from __future__ import annotations

from rlvr_core.core.net import free_port
from rlvr_core.sampling.weight_push.collective import CollectiveTransport

__all__ = ["NcclTransport"]


class NcclTransport(CollectiveTransport):
    type = "nccl"
    server_backend = "nccl"
    needs_cuda = True

    @classmethod
    def init_info(cls, world_size: int, timeout_s: float, port: int | None = None, address: str = "127.0.0.1"):
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        return NCCLTrainerInitInfo(master_address=address, master_port=port or free_port(), world_size=world_size,
                                   rank=0)

    def prepare(self, weights, version: int):
        """The pairs on the trainer's GPU (NCCL moves device tensors)."""
        return [(k, v.to("cuda")) for k, v in super().prepare(weights, version)]

    def after_send(self) -> None:
        import torch

        torch.cuda.synchronize()
