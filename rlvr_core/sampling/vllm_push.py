"""`rlvr_file`: a CPU-capable vLLM weight-transfer backend, loaded inside a `vllm serve` process.

vLLM's own weight-transfer backends (`nccl`, `ipc`) move tensors between CUDA devices. This one moves them
through a folder both sides can read (a shared disk, the prime-rl convention): the trainer writes one
safetensors file per policy version (`v000012.safetensors`, written beside its final name and renamed, so a
reader never sees half a file), then drives vLLM's ordinary weight-transfer routes (`/start_weight_update`,
`/update_weights` with the file's path, size and version, `/finish_weight_update` with the version). The
server's worker waits until the file has the announced size (a network file system may show it late; the
wait is bounded), loads it with vLLM's layer-wise reload (the same path `reload_weights` takes, which is the
one that works on vLLM's CPU backend) and so serves the new weights from the next request on.

The backend is registered when this module is imported. A `vllm serve` process imports it through
`--worker-extension-cls rlvr_core.sampling.vllm_push.RlvrWeightPushExtension` (the worker resolves that class
before it builds its weight-transfer engine), with `--weight-transfer-config '{"backend": "rlvr_file"}'`.
This module imports vLLM at import time: only the server and code that already has vLLM import it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

__all__ = ["BACKEND", "FileWeightTransferEngine", "RlvrWeightPushExtension"]

BACKEND = "rlvr_file"
FILE_WAIT_S = 60.0  # how long the server waits for an announced file to reach its size (shared-disk lag)


@dataclass
class FileInitInfo(WeightTransferInitInfo):
    folder: str  # where the trainer writes the versions (both sides must see it under this path)


@dataclass
class FileUpdateInfo(WeightTransferUpdateInfo):
    path: str     # the version's safetensors file
    nbytes: int   # its size as the trainer wrote it
    version: int  # the policy version (optimizer steps) it holds


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


class FileWeightTransferEngine(WeightTransferEngine[FileInitInfo, FileUpdateInfo]):
    """Worker side: load the version file named by each update into the served model (layer-wise reload)."""

    init_info_cls = FileInitInfo
    update_info_cls = FileUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.folder: Path | None = None
        self.wait_s = float(os.environ.get("RLVR_WEIGHT_FILE_WAIT_S", FILE_WAIT_S))

    def init_transfer_engine(self, init_info: FileInitInfo) -> None:
        self.folder = Path(init_info.folder)

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.receive_weights(self.parse_update_info(update_info))
        if torch.accelerator.is_available():  # loads onto a GPU are asynchronous
            torch.accelerator.synchronize()

    def receive_weights(self, update_info: FileUpdateInfo) -> None:
        from safetensors.torch import load_file

        if self.folder is None:
            raise RuntimeError("update_weights before init_weight_transfer_engine")
        path = Path(update_info.path)
        if path.parent.resolve() != self.folder.resolve():
            raise ValueError(f"weight file {path} is outside the push folder {self.folder}")
        _wait_for_file(path, int(update_info.nbytes), self.wait_s)
        weights = load_file(str(path), device=str(self.device) if self.device.type != "cpu" else "cpu")
        self.model.load_weights(iter(weights.items()))

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def shutdown(self) -> None:
        self.folder = None


class RlvrWeightPushExtension:
    """Named by `--worker-extension-cls` so that the server's worker imports this module (and with it the
    backend's registration) before it builds its weight-transfer engine. It adds no worker methods."""


if BACKEND not in WeightTransferEngineFactory._registry:
    WeightTransferEngineFactory.register_engine(BACKEND, FileWeightTransferEngine)
