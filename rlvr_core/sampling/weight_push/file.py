"""`file`: one safetensors file per policy version in a folder the trainer and the servers both see (a shared
disk across machines, the prime-rl convention); CPU or GPU.

The trainer writes `v000012.safetensors` beside its final name and renames it (a reader never sees half a
file), tells each server the folder once (`/init_weight_transfer_engine`), then per version drives vLLM's
weight-transfer routes: `/start_weight_update`, `/update_weights` with the file's path, size and version,
`/finish_weight_update` labelled with the version. The server half is our `rlvr` backend (vllm_backend.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

from rlvr_core.sampling.vllm_client import ServerClient
from rlvr_core.sampling.weight_push.base import Transport

__all__ = ["FileTransport", "write_version_file"]


def write_version_file(folder: Path, version: int, weights: Iterable[tuple[str, "object"]]) -> tuple[Path, int]:
    """Write one policy version as `v{version:06d}.safetensors` (beside its final name, then renamed, so a
    reader never sees part of it); returns the path and its size. Older version files are removed."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"v{version:06d}.safetensors"
    tmp = folder / f".{path.name}.{os.getpid()}.tmp"
    tensors, seen = {}, set()
    for k, v in weights:
        v = v.detach().to("cpu").contiguous()
        if v.data_ptr() in seen:  # a tied weight (lm_head = embeddings): sent as its own copy (safetensors refuses
            v = v.clone()         # shared storage); without it vLLM's CPU reload kept the old lm_head (measured)
        seen.add(v.data_ptr())
        tensors[k] = v
    save_file(tensors, str(tmp))
    os.replace(tmp, path)
    for old in folder.glob("v*.safetensors"):
        if old != path:
            old.unlink(missing_ok=True)
    return path, path.stat().st_size


class FileTransport(Transport):
    """The folder is `config.folder` (None: this engine cannot push)."""

    type = "file"
    server_backend = "rlvr"

    def __init__(self, config, clients, pool=None) -> None:
        super().__init__(config, clients, pool)
        self.folder = Path(config.folder) if config.folder is not None else None
        self._ready = False  # every server told the folder
        self._pushed = False

    def prepare(self, weights, version: int) -> tuple[Path, int]:
        """Write the version file (and, before the first push, tell every server the folder)."""
        if self.folder is None:
            raise RuntimeError("this vllm-server engine has no push folder: it cannot push weights")
        path, nbytes = write_version_file(self.folder, version, weights)
        self._pushed = True
        if not self._ready:
            self.each(self.init)
            self._ready = True
        return path, nbytes

    def init(self, client: ServerClient) -> None:
        client.call("POST", "/init_weight_transfer_engine", client.push_timeout_s,
                    {"init_info": {"folder": str(self.folder)}})

    def send(self, client: ServerClient, payload: Any, version: int) -> None:
        """Load the version file into the server: start, update, finish (labelled `version`)."""
        path, nbytes = payload
        client.call("POST", "/start_weight_update", client.push_timeout_s)
        client.call("POST", "/update_weights", client.push_timeout_s,
                    {"update_info": {"path": str(path), "nbytes": nbytes, "version": version}})
        client.call("POST", "/finish_weight_update", client.push_timeout_s, {"weight_version": str(version)})

    def close(self) -> None:
        """Remove the last version file (a model's size; the servers loaded it)."""
        if self.folder is not None and self._pushed:
            for f in self.folder.glob("v*.safetensors"):
                f.unlink(missing_ok=True)
