"""How the trainer's weights reach `vllm serve` processes (`sampling.push`): one module per transport behind
`base.Transport`, chosen by `sampling.push.type` (rlvr_core/experiment/push_config.py: the names, the alias,
each transport's options).

| type | module | server `--weight-transfer-config` | where it applies |
|---|---|---|---|
| `file` | file.py | `{"backend": "rlvr"}` | CPU or GPU; trainer and servers see one folder |
| `gloo` | gloo.py (+ collective.py) | `{"backend": "rlvr"}` | CPU or GPU; servers the trainer reaches over TCP |
| `nccl` | nccl.py (+ collective.py) | `{"backend": "nccl"}` | CUDA; servers on other GPUs |
| `ipc` | ipc.py | `{"backend": "ipc"}` | CUDA; servers on the trainer's GPU |

A push of version v: `prepare` once (write the file, move the pairs to the device), `send` to every server
(which labels the weights v), then the one version check (`base.check_version`: each server must report v).
vllm_backend.py is our `rlvr` backend inside the servers (file and gloo). Importing this package imports
neither torch nor vLLM.
"""

from __future__ import annotations

from concurrent.futures import Executor
from typing import Any

from rlvr_core.experiment.push_config import push_config
from rlvr_core.sampling.vllm_client import ServerClient
from rlvr_core.sampling.weight_push.base import Transport, check_version, wait_for_version
from rlvr_core.sampling.weight_push.file import FileTransport, write_version_file
from rlvr_core.sampling.weight_push.gloo import GlooTransport
from rlvr_core.sampling.weight_push.ipc import IpcTransport
from rlvr_core.sampling.weight_push.nccl import NcclTransport

__all__ = ["TRANSPORTS", "Transport", "transport_class", "make_transport", "check_version", "wait_for_version",
           "write_version_file"]

TRANSPORTS: dict[str, type[Transport]] = {t.type: t for t in (FileTransport, GlooTransport, NcclTransport,
                                                               IpcTransport)}


def transport_class(push: Any) -> type[Transport]:
    """The transport of a push config, mapping or type name (an alias mapped; ValueError for an unknown one)."""
    return TRANSPORTS[push_config(push).type]


def make_transport(push: Any, clients: list[ServerClient], pool: Executor | None = None) -> Transport:
    """The transport `push` names (a config, mapping or type name) into `clients`, pushing on `pool`."""
    config = push_config(push)
    return TRANSPORTS[config.type](config, clients, pool)
