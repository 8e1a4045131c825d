"""What a weight-push transport does, and the one version check every push ends with."""

from __future__ import annotations

import time
from concurrent.futures import Executor
from typing import Any, ClassVar, Iterable

from rlvr_core.sampling.vllm_client import ServerClient, ServerError

__all__ = ["Transport", "check_version", "holds_version", "wait_for_version", "label_version", "pairs_source"]


def holds_version(client: ServerClient, version: int) -> bool:
    """Whether the server reports `version` as its weight version (its `/weight_info`)."""
    return client.weight_version() == str(version)


def check_version(client: ServerClient, version: int) -> None:
    """After a push: ServerError naming the server unless it reports `version`."""
    got = client.weight_version()
    if got != str(version):
        raise ServerError(f"vLLM server {client.url}: reports weight version {got!r} after the push of {version}")


def wait_for_version(clients: list[ServerClient], version: int, timeout_s: float) -> None:
    """Wait (bounded) until every server reports `version`, pushed by another rank; ServerError naming the
    first server that does not within timeout_s."""
    deadline = time.monotonic() + timeout_s
    for c in clients:
        while not holds_version(c, version):
            if time.monotonic() > deadline:
                raise ServerError(f"vLLM server {c.url}: weight version {version} not there within "
                                  f"{timeout_s:g}s (rank 0 pushes it)")
            time.sleep(0.05)


class Transport:
    """One way of moving a policy version into every server (`sampling.push.type`). A subclass says how this
    version's weights are made ready once (`prepare`) and how one server gets them, labelled with the version
    (`send`); `push` does that for every server and then checks that each reports the version."""

    type: ClassVar[str]                       # the name in sampling.push.type
    server_backend: ClassVar[str]             # the servers' --weight-transfer-config backend
    server_env: ClassVar[dict[str, str]] = {}  # environment the servers need for it
    needs_cuda: ClassVar[bool] = False
    concurrent: ClassVar[bool] = True         # all servers at once (the pool), else one after another

    def __init__(self, config: Any, clients: list[ServerClient], pool: Executor | None = None) -> None:
        if self.needs_cuda:
            _need_cuda(self.type)
        self.config, self.clients, self.pool = config, list(clients), pool

    def prepare(self, weights: Iterable[tuple[str, Any]], version: int) -> Any:
        """This version's weights as `send` takes them, once for every server: detached, contiguous pairs."""
        return [(k, v.detach().contiguous()) for k, v in weights]

    def send(self, client: ServerClient, payload: Any, version: int) -> None:
        raise NotImplementedError

    def push_one(self, client: ServerClient, payload: Any, version: int) -> None:
        self.send(client, payload, version)
        check_version(client, version)

    def push(self, weights: Iterable[tuple[str, Any]], version: int) -> None:
        """`version` into every server; ServerError naming a server that fails or does not answer in time."""
        payload = self.prepare(weights, version)
        self.each(lambda c: self.push_one(c, payload, version))

    def each(self, fn) -> list:
        """fn(client) for every server, concurrently on the pool when the transport allows it."""
        if self.concurrent and self.pool is not None:
            return list(self.pool.map(fn, self.clients))
        return [fn(c) for c in self.clients]

    def close(self) -> None:
        """Release what the pushes left behind (nothing by default)."""


def label_version(client: ServerClient, version: int) -> None:
    """Name the weights a server just received `version` (vLLM's `/update_weight_version`)."""
    client.call("POST", "/update_weight_version", client.push_timeout_s, {"new_version": str(version)})


def pairs_source(pairs):
    """A vLLM `WeightSource` over (name, tensor) pairs; `pairs()` is read each round (vLLM's trainer engines
    take their tensors from one)."""
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class _Pairs(WeightSource):
        def metadata(self):
            return [ParamMeta(k, v.dtype, tuple(v.shape)) for k, v in pairs()]

        def __iter__(self):
            return iter(pairs())

    return _Pairs()


def _need_cuda(name: str) -> None:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(f"weight push backend {name!r} needs CUDA (trainer and servers on GPUs); "
                           f"on CPU use 'file' or 'gloo'")
