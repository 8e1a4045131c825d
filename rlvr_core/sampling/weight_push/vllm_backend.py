"""`rlvr`: a CPU-capable vLLM weight-transfer backend serving two transports (`file`, `gloo`), loaded inside a
`vllm serve` process: the server half of file.py and gloo.py, and the trainer engine of gloo.

The init info picks the transport, so one server serves both (its backend is fixed when it starts, the
transport is chosen by each `/init_weight_transfer_engine`): `folder` = versions as files (below);
`master_address`/`master_port`/`world_size` = a torch gloo group, the CPU twin of vLLM's `nccl` backend (the
trainer is rank 0, the server's workers follow from `rank_offset`; each round the trainer broadcasts every
tensor named by `/update_weights` while the worker receives them). The gloo group is built from its own
TCPStore, apart from any default torch.distributed world of the worker, with the push timeout: a dead peer is
an error, not a hang. The trainer side of gloo (`GlooTrainerEngine`) is registered with vLLM's trainer
factory under `rlvr_gloo`.

vLLM's own weight-transfer backends (`nccl`, `ipc`) move tensors between CUDA devices. The file transport
moves them through a folder both sides can read (file.py writes one safetensors file per version and drives
vLLM's weight-transfer routes with its path, size and version). The server's worker waits until the file has
the announced size (a network file system may show it late; the wait is bounded), loads it with vLLM's layer-wise reload (the same path `reload_weights` takes, which is the
one that works on vLLM's CPU backend) and so serves the new weights from the next request on.

The backend is registered when this module is imported. A `vllm serve` process imports it through
`--worker-extension-cls rlvr_core.sampling.weight_push.vllm_backend.RlvrWeightPushExtension` (the worker
resolves that class before it builds its weight-transfer engine; `rlvr_core.sampling.vllm_push` names the
same class), with `--weight-transfer-config '{"backend": "rlvr"}'` (the push aliases of push_config.py, such
as `rlvr_file`, name the same backend).
This module imports vLLM at import time: only the server and code that already has vLLM import it.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

import torch
from vllm.distributed.weight_transfer.base import (
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory

from rlvr_core.experiment.push_config import PUSH_ALIASES

__all__ = ["BACKEND", "GLOO_TRAINER_BACKEND", "RlvrWeightTransferEngine", "GlooTrainerInitInfo",
           "GlooTrainerEngine", "RlvrWeightPushExtension", "gloo_group"]

BACKEND = "rlvr"
GLOO_TRAINER_BACKEND = "rlvr_gloo"
FILE_WAIT_S = 60.0  # how long the server waits for an announced file to reach its size (shared-disk lag)


@dataclass
class RlvrInitInfo(WeightTransferInitInfo):
    folder: str | None = None          # file transport: where the trainer writes the versions
    master_address: str | None = None  # gloo transport: the trainer's TCPStore
    master_port: int | None = None
    world_size: int | None = None      # 1 (the trainer) + the server's workers
    rank_offset: int = 1
    timeout_s: float = 120.0           # every gloo operation (rendezvous, broadcast)


@dataclass
class RlvrUpdateInfo(WeightTransferUpdateInfo):
    path: str | None = None     # file: the version's safetensors file
    nbytes: int | None = None   # file: its size as the trainer wrote it
    version: int | None = None  # file: the policy version it holds
    names: list[str] | None = None        # gloo: the tensors broadcast this round, in order
    dtype_names: list[str] | None = None
    shapes: list[list[int]] | None = None


def gloo_group(host: str, port: int, rank: int, world_size: int, timeout_s: float):
    """A gloo process group of its own (TCPStore rendezvous, rank 0 hosts the store), independent of the
    default torch.distributed group; every operation on it fails after timeout_s."""
    from torch.distributed import PrefixStore, ProcessGroupGloo, TCPStore

    timeout = timedelta(seconds=timeout_s)
    store = TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout, wait_for_workers=False)
    return ProcessGroupGloo(PrefixStore("rlvr_push", store), rank, world_size, timeout)


def _broadcast(group, tensor: torch.Tensor) -> None:
    from torch.distributed import BroadcastOptions

    opts = BroadcastOptions()
    opts.rootRank = 0
    group.broadcast([tensor], opts).wait()


def _wait_for_file(path: Path, nbytes: int, timeout_s: float) -> None:
    """Wait until `path` exists with `nbytes` bytes; a FileNotFoundError/ValueError naming it after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        size = path.stat().st_size if path.exists() else None
        if size == nbytes:
            return
        if time.monotonic() >= deadline:
            if size is None:
                raise FileNotFoundError(f"weight file {path} did not appear within {timeout_s:g}s")
            raise ValueError(f"weight file {path} has {size} bytes after {timeout_s:g}s, the trainer wrote {nbytes}")
        time.sleep(0.05)


class RlvrWeightTransferEngine(WeightTransferEngine[RlvrInitInfo, RlvrUpdateInfo]):
    """Worker side: load each update into the served model (layer-wise reload), from the version file it
    names (file transport) or from the trainer's gloo broadcast (gloo transport)."""

    init_info_cls = RlvrInitInfo
    update_info_cls = RlvrUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.folder: Path | None = None
        self.group = None
        self.wait_s = float(os.environ.get("RLVR_WEIGHT_FILE_WAIT_S", FILE_WAIT_S))

    def init_transfer_engine(self, init_info: RlvrInitInfo) -> None:
        """A new init replaces the transport (a server serves file and gloo pushes, one at a time)."""
        self.folder, self.group = None, None
        if init_info.folder is not None:
            self.folder = Path(init_info.folder)
            return
        if init_info.master_address is None or init_info.master_port is None or not init_info.world_size:
            raise ValueError("init_info needs `folder` (file) or master_address, master_port, world_size (gloo)")
        pc = self.parallel_config
        rank = pc.data_parallel_index * pc.world_size + pc.rank + init_info.rank_offset
        self.group = gloo_group(init_info.master_address, int(init_info.master_port), rank,
                                int(init_info.world_size), float(init_info.timeout_s))

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.receive_weights(self.parse_update_info(update_info))
        if torch.accelerator.is_available():  # loads onto a GPU are asynchronous
            torch.accelerator.synchronize()

    def receive_weights(self, update_info: RlvrUpdateInfo) -> None:
        if self.group is not None:
            return self._receive_gloo(update_info)
        from safetensors.torch import load_file

        if self.folder is None:
            raise RuntimeError("update_weights before init_weight_transfer_engine")
        path = Path(update_info.path)
        if path.parent.resolve() != self.folder.resolve():
            raise ValueError(f"weight file {path} is outside the push folder {self.folder}")
        _wait_for_file(path, int(update_info.nbytes), self.wait_s)
        weights = load_file(str(path), device=str(self.device) if self.device.type != "cpu" else "cpu")
        self.model.load_weights(iter(weights.items()))

    def _receive_gloo(self, info: RlvrUpdateInfo) -> None:
        for name, dtype_name, shape in zip(info.names or [], info.dtype_names or [], info.shapes or []):
            t = torch.empty(shape, dtype=getattr(torch, dtype_name))  # gloo moves CPU tensors
            _broadcast(self.group, t)
            self.model.load_weights([(name, t.to(self.device))])

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def shutdown(self) -> None:
        self.folder, self.group = None, None


@dataclass
class GlooTrainerInitInfo(TrainerInitInfo):
    """Trainer side of the gloo transport: rank 0 of a group of 1 + the server's workers."""

    backend: ClassVar[str] = GLOO_TRAINER_BACKEND

    master_address: str
    master_port: int
    world_size: int
    timeout_s: float = 120.0


class GlooTrainerEngine(TrainerWeightTransferEngine[GlooTrainerInitInfo]):
    """vLLM's nccl trainer engine on a gloo group: rendezvous concurrently with the server's
    init_weight_transfer_engine; each round start, update_weights concurrently with the broadcast, finish."""

    init_info_cls = GlooTrainerInitInfo

    @classmethod
    def trainer_init(cls, init_info: GlooTrainerInitInfo, *, client, source=None):
        if source is None:
            raise ValueError("the gloo trainer engine needs a WeightSource")
        engine = cls(client=client, source=source, is_sender=init_info.is_sender)
        worker = RlvrInitInfo(master_address=init_info.master_address, master_port=init_info.master_port,
                              world_size=init_info.world_size, rank_offset=1, timeout_s=init_info.timeout_s)
        with ThreadPoolExecutor(max_workers=1) as exe:
            future = exe.submit(client.init_weight_transfer_engine, asdict(worker))
            engine.group = gloo_group(init_info.master_address, init_info.master_port, 0,
                                      init_info.world_size, init_info.timeout_s)
            future.result()
        return engine

    def send_weights(self) -> None:
        meta = self.source.metadata()
        info = RlvrUpdateInfo(names=[m.name for m in meta], dtype_names=[str(m.dtype).split(".")[-1] for m in meta],
                              shapes=[list(m.shape) for m in meta])
        self.client.start_weight_update()
        exe = ThreadPoolExecutor(max_workers=1)
        try:
            future = exe.submit(self.client.update_weights, asdict(info))
            for _, t in self.source:
                _broadcast(self.group, t.detach().to("cpu").contiguous())
            future.result()
        finally:
            exe.shutdown(wait=False)  # after a failed broadcast the worker's call may never return
        self.client.finish_weight_update()

    def shutdown(self) -> None:
        self.group = None


class RlvrWeightPushExtension:
    """Named by `--worker-extension-cls` so that the server's worker imports this module (and with it the
    backend's registration) before it builds its weight-transfer engine. It adds no worker methods."""


for _name in (BACKEND, *PUSH_ALIASES):
    if _name not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(_name, RlvrWeightTransferEngine)
if GLOO_TRAINER_BACKEND not in WeightTransferTrainerFactory._registry:
    WeightTransferTrainerFactory.register_engine(GLOO_TRAINER_BACKEND, GlooTrainerEngine)
