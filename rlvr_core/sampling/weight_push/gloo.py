"""`gloo`: a torch gloo broadcast from the trainer into each server's workers (CPU; servers the trainer
reaches over TCP), the CPU twin of vLLM's `nccl`. The trainer engine (`GlooTrainerEngine`) and the server half
are our `rlvr` backend (vllm_backend.py); the group logic is collective.py's."""

from __future__ import annotations

from rlvr_core.core.net import free_port
from rlvr_core.sampling.weight_push.collective import CollectiveTransport

__all__ = ["GlooTransport"]


class GlooTransport(CollectiveTransport):
    type = "gloo"
    server_backend = "rlvr"  # one server backend serves both CPU transports: the init info picks one

    @classmethod
    def init_info(cls, world_size: int, timeout_s: float, port: int | None = None, address: str = "127.0.0.1"):
        from rlvr_core.sampling.weight_push.vllm_backend import GlooTrainerInitInfo

        return GlooTrainerInitInfo(master_address=address, master_port=port or free_port(), world_size=world_size,
                                   timeout_s=timeout_s, rank=0)
