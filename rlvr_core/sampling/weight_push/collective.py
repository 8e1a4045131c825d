"""What the two broadcast transports (`gloo`, `nccl`) share: per server, a group of the trainer (rank 0) and
the server's workers (`push.workers`, its TP*PP*DP), built at the first push through vLLM's trainer engine
factory over its HTTP control client; each push broadcasts every tensor under a deadline, then labels the
version. After a failure the group is unusable (a peer may be stuck inside a broadcast): later pushes to that
server raise ServerError naming it.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any
from urllib.parse import urlparse

from rlvr_core.sampling.vllm_client import ServerClient, ServerError
from rlvr_core.sampling.weight_push.base import Transport, label_version, pairs_source

__all__ = ["CollectiveTransport", "rendezvous_address"]


def rendezvous_address(server_url: str) -> str:
    """The address a server's workers reach the trainer's push group at: `RLVR_PUSH_ADDRESS` if set, else
    127.0.0.1 for a server on this machine, else this machine's host address."""
    if os.environ.get("RLVR_PUSH_ADDRESS"):
        return os.environ["RLVR_PUSH_ADDRESS"]
    if urlparse(server_url).hostname in ("127.0.0.1", "localhost", "::1"):
        return "127.0.0.1"
    return socket.gethostbyname(socket.gethostname())


class CollectiveTransport(Transport):
    """A subclass gives the trainer's init info (`init_info`) and what follows a broadcast (`after_send`)."""

    def __init__(self, config, clients, pool=None) -> None:
        super().__init__(config, clients, pool)
        self._groups = {c.url: _Group(self, c) for c in self.clients}

    @classmethod
    def init_info(cls, world_size: int, timeout_s: float, port: int | None = None, address: str = "127.0.0.1"):
        """The trainer-side init info of a push into one server: rank 0 of `world_size` (1 + the server's
        workers), rendezvous at `address` on `port` (default: a free one)."""
        raise NotImplementedError

    def after_send(self) -> None:
        """Called after each server's broadcast (nccl: wait for the device)."""

    def send(self, client: ServerClient, payload: Any, version: int) -> None:
        self._groups[client.url].send(payload, version)
        label_version(client, version)


class _Group:
    """One server's group: its trainer engine, the pairs of the version being sent, and why it broke."""

    def __init__(self, transport: CollectiveTransport, client: ServerClient) -> None:
        self.transport, self.client = transport, client
        self.pairs: list = []
        self.trainer = None
        self.broken: str | None = None

    def send(self, pairs, version: int) -> None:
        c, name = self.client, self.transport.type
        if self.broken:
            raise ServerError(f"vLLM server {c.url}: its {name} transfer group failed earlier ({self.broken})")
        self.pairs = pairs
        try:
            _with_deadline(self._send, c.push_timeout_s * 2)  # rendezvous and broadcast: one timeout each
        except Exception as e:  # noqa: BLE001 - any failure leaves the group unusable
            self.broken = f"{type(e).__name__}: {str(e)[:200]}"
            raise ServerError(f"vLLM server {c.url}: {name} weight push of version {version} failed "
                              f"({self.broken}); its transfer group is unusable") from None

    def _send(self) -> None:
        from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

        import rlvr_core.sampling.weight_push.vllm_backend  # noqa: F401 - registers the gloo trainer engine

        if self.trainer is None:
            t, c = self.transport, self.client
            info = t.init_info(1 + t.config.workers, c.push_timeout_s, address=rendezvous_address(c.url))
            http = HTTPVLLMWeightSyncClient(c.url, timeout=c.push_timeout_s)
            source = pairs_source(lambda: self.pairs)  # the version being sent, each round
            self.trainer = WeightTransferTrainerFactory.trainer_init(info, client=http, source=source)
        self.trainer.send_weights()
        self.transport.after_send()


def _with_deadline(fn, timeout_s: float) -> None:
    """Run fn in a thread and wait at most timeout_s (vLLM's nccl broadcast has no timeout of its own); a
    TimeoutError after that, the thread left behind (it may never return)."""
    box: dict = {}

    def run():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e

    t = threading.Thread(target=run, daemon=True, name="rlvr-collective-push")
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise TimeoutError(f"not done within {timeout_s:g}s")
    if "error" in box:
        raise box["error"]
