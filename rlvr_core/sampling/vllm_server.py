"""`vllm-server` engine: the same sampling interface over HTTP, on one or more `vllm serve` processes.

Generation gets processes (and, on a GPU cluster, devices) of its own; the trainer pushes each new policy
version into the servers through vLLM's weight-transfer routes (`push_backend`: `file` = version files on a
shared disk and `gloo` = a torch gloo group, both through our `rlvr` server backend in `vllm_push.py`, on CPU
or GPU; vLLM's `nccl` (servers on other GPUs) and `ipc` (the trainer's GPU) need CUDA). Everything the
in-process `vllm` engine promises holds here too, because the request is the same: prompts tokenized by our tokenizer, one request per
(prompt, sample index) with its own seed, raw log-probs of the sampled token, the hf engine's eos ids, our
own decode and stop-string cut. The route is vLLM's token-in/token-out `/inference/v1/generate`, which also
reports the weight version that sampled each token; `Sample.weight_version` records it.

Every HTTP call has a timeout, and a failure names the server: a dead or hung server ends the step with
`ServerError`, never a hang. Requests are spread over the servers by prompt: every sample of one prompt goes
to one server (its prefix cache reuses the prompt, and one server's weights sample the whole group), prompts
round-robin from the first server in input order; all requests are sent concurrently (vLLM batches them).
The seeds are per request, so which server sampled a prompt does not change its samples. No vLLM import
here: the client needs only `requests` and the tokenizer.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable
from urllib.parse import urlparse

from rlvr_core.core.seeding import request_seed
from rlvr_core.sampling.base import Sample, SamplingParams, check_prompt_ids, find_stop
from rlvr_core.sampling.vllm import VLLMEngine, _eos_ids, to_vllm_sampling_kwargs
from rlvr_core.core.net import free_port as _free_port

__all__ = ["ServerError", "ServerClient", "VLLMServerEngine", "write_version_file", "PUSH_BACKEND", "PUSH_BACKENDS",
           "SERVER_BACKEND", "push_backend_name", "collective_init_info"]

PUSH_BACKEND = "file"
PUSH_BACKENDS = ("file", "gloo", "nccl", "ipc")
COLLECTIVE_BACKENDS = ("gloo", "nccl")  # a group per server, the trainer broadcasting as rank 0
_ALIASES = {"rlvr_file": "file"}  # an older name of `file`
SERVER_BACKEND = {"file": "rlvr", "gloo": "rlvr", "nccl": "nccl", "ipc": "ipc"}  # --weight-transfer-config


def push_backend_name(name: str) -> str:
    """`name` as one of PUSH_BACKENDS (older names mapped); ValueError naming the known ones."""
    name = _ALIASES.get(name, name)
    if name not in PUSH_BACKENDS:
        raise ValueError(f"unknown weight push backend {name!r}; known: {list(PUSH_BACKENDS)}")
    return name
_NO_LOGPROB_TEXT = "rlvr_no_logprob_text"


class ServerError(RuntimeError):
    """A vLLM server failed, timed out or answered wrongly; the message starts with its URL."""


@dataclass
class ServerClient:
    """One `vllm serve` process at `url` (http://host:port). request_timeout_s bounds one generation request;
    push_timeout_s bounds each call of a weight push."""

    url: str
    request_timeout_s: float = 300.0
    push_timeout_s: float = 120.0

    def _call(self, method: str, path: str, timeout: float, body: dict | None = None) -> dict:
        import requests

        t0 = time.monotonic()
        try:
            r = requests.request(method, f"{self.url.rstrip('/')}{path}", json=body, timeout=timeout)
        except requests.Timeout:
            raise ServerError(f"vLLM server {self.url}: no answer to {path} within {timeout:g}s") from None
        except requests.ConnectionError as e:
            raise ServerError(f"vLLM server {self.url}: {path} failed after {time.monotonic() - t0:.1f}s "
                              f"(connection: {type(e).__name__})") from None
        if r.status_code != 200:
            raise ServerError(f"vLLM server {self.url}: {path} answered HTTP {r.status_code}: {r.text[:300]}")
        return r.json() if r.content else {}

    def healthy(self, timeout: float = 2.0) -> bool:
        try:
            self._call("GET", "/health", timeout)
            return True
        except ServerError:
            return False

    def weight_version(self) -> str | None:
        return self._call("GET", "/weight_info", self.push_timeout_s).get("weight_version")

    def generate(self, token_ids: list[int], sampling_params: dict) -> dict:
        """One request; the single choice of vLLM's answer (token_ids, logprobs, finish_reason, weight_versions)."""
        body = {"token_ids": token_ids, "sampling_params": sampling_params, "output_mode": "tokens"}
        out = self._call("POST", "/inference/v1/generate", self.request_timeout_s, body)
        return out["choices"][0]

    def init_push(self, folder: str | Path) -> None:
        self._call("POST", "/init_weight_transfer_engine", self.push_timeout_s,
                   {"init_info": {"folder": str(folder)}})

    def push(self, path: Path, nbytes: int, version: int) -> None:
        """Load the version file into the server: start, update, finish (labelled `version`), then check that
        the server reports that version."""
        self._call("POST", "/start_weight_update", self.push_timeout_s)
        self._call("POST", "/update_weights", self.push_timeout_s,
                   {"update_info": {"path": str(path), "nbytes": nbytes, "version": version}})
        self._call("POST", "/finish_weight_update", self.push_timeout_s, {"weight_version": str(version)})
        got = self.weight_version()
        if got != str(version):
            raise ServerError(f"vLLM server {self.url}: reports weight version {got!r} after the push of {version}")


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


class VLLMServerEngine:
    """Sampling engine over `vllm serve` processes (see the module docstring).

    servers: their URLs. model_dir: the served model's folder (tokenizer, generation config for the eos ids).
    push_folder: where weight versions are written for the servers to load (None: no pushes; the servers keep
    what they loaded). push_backend: file | gloo | nccl | ipc (see PUSH_BACKENDS; ipc servers need
    VLLM_ALLOW_INSECURE_SERIALIZATION=1 for its handles over HTTP). server_workers: each server's TP*PP*DP
    workers (the collective group's size is 1 + that). max_concurrency: requests in flight at once, over all servers.
    """

    name = "vllm-server"

    def __init__(self, servers: list[str], model_dir: str | Path, *, tokenizer=None, add_special_tokens: bool = True,
                 push_folder: str | Path | None = None, request_timeout_s: float = 300.0,
                 push_timeout_s: float = 120.0, max_concurrency: int = 64, pad_token_id: int | None = None,
                 push_backend: str = PUSH_BACKEND, server_workers: int = 1):
        self.push_backend = push_backend_name(push_backend)
        if self.push_backend == "nccl":
            _need_cuda("nccl")
        if not servers:
            raise ValueError("vllm-server engine needs at least one server URL")
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        self.tokenizer = tokenizer
        self.add_special_tokens = add_special_tokens
        self.clients = [ServerClient(u, request_timeout_s, push_timeout_s) for u in servers]
        self.eos_token_ids = frozenset(_eos_ids(model_dir, tokenizer))
        pad = pad_token_id if pad_token_id is not None else tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else (tokenizer.eos_token_id or 0))
        self.push_folder = Path(push_folder) if push_folder is not None else None
        self._pool = ThreadPoolExecutor(max_workers=max(max_concurrency, len(self.clients)),
                                        thread_name_prefix="rlvr-vllm-server")
        self._push_ready = False
        self.server_workers = int(server_workers)
        self._collective: dict[str, _CollectivePush] = {}  # per server URL: its trainer engine and group
        self.version: int | None = None  # the last version pushed
        self.push_seconds: list[float] = []

    # ---- weights ---------------------------------------------------------------------------------------
    def push_weights(self, weights: Iterable[tuple[str, "object"]], version: int) -> float:
        """Write `version` and load it into every server (concurrently); seconds taken. A server that fails or
        does not answer within the push timeout raises ServerError naming it."""
        t0 = time.perf_counter()
        if self.push_backend == "ipc":
            _push_ipc(self.clients, weights, version)
            self.version = version
            self.push_seconds.append(time.perf_counter() - t0)
            return self.push_seconds[-1]
        if self.push_backend in COLLECTIVE_BACKENDS:
            self._push_collective(weights, version)
            self.version = version
            self.push_seconds.append(time.perf_counter() - t0)
            return self.push_seconds[-1]
        if self.push_folder is None:
            raise RuntimeError("this vllm-server engine has no push folder: it cannot push weights")
        path, nbytes = write_version_file(self.push_folder, version, weights)
        if not self._push_ready:
            list(self._pool.map(lambda c: c.init_push(self.push_folder), self.clients))
            self._push_ready = True
        list(self._pool.map(lambda c: c.push(path, nbytes, version), self.clients))
        self.version = version
        self.push_seconds.append(time.perf_counter() - t0)
        return self.push_seconds[-1]

    def _push_collective(self, weights, version: int) -> None:
        pairs = [(k, v.detach().contiguous()) for k, v in weights]
        for c in self.clients:
            if c.url not in self._collective:
                self._collective[c.url] = _CollectivePush(c, self.push_backend, 1 + self.server_workers)
        list(self._pool.map(lambda c: self._collective[c.url].push(pairs, version), self.clients))

    # ---- sampling --------------------------------------------------------------------------------------
    def _request_params(self, params: SamplingParams, seed: int) -> dict:
        kw = to_vllm_sampling_kwargs(params, seed, self.eos_token_ids)
        kw["extra_args"] = {_NO_LOGPROB_TEXT: True}
        return kw

    def generate(self, prompts: list[str], prompt_ids: list[str], params: SamplingParams, *,
                 step: int = 0, epoch: int = 0, first_sample_index: int = 0,
                 clients: list[ServerClient] | None = None) -> list[list[Sample]]:
        """Per prompt (input order), params.n samples ordered by sample_index from `first_sample_index`; the
        seeds of the other engines; each Sample's `weight_version` is the version the server sampled it with.
        Prompt i goes to server i mod len(clients) (clients: a subset of the servers; default all)."""
        clients = clients or self.clients
        check_prompt_ids(prompts, prompt_ids)
        encoded = [self.tokenizer(p, add_special_tokens=self.add_special_tokens)["input_ids"] for p in prompts]
        jobs = []
        for i, (ids, pid) in enumerate(zip(encoded, prompt_ids)):
            if len(ids) == 0:
                raise ValueError(f"prompt {pid!r} encodes to zero tokens")
            for s in range(first_sample_index, first_sample_index + params.n):
                jobs.append((i, s, request_seed(params.seed, pid, step, s, epoch=epoch), list(ids)))
        futures = [self._pool.submit(clients[i % len(clients)].generate, ids, self._request_params(params, seed))
                   for (i, _, seed, ids) in jobs]
        result: list[list[Sample]] = [[] for _ in prompts]
        for (i, s, seed, _), fut in zip(jobs, futures):
            result[i].append(self._to_sample(fut.result(), prompt_ids[i], s, seed, params))
        return result

    def _to_sample(self, choice: dict, prompt_id: str, sample_index: int, seed: int, params: SamplingParams) -> Sample:
        reason = choice.get("finish_reason")
        if reason not in ("stop", "length"):
            raise ServerError(f"vLLM request {prompt_id!r}/{sample_index} finished with {reason!r}")
        token_ids = [int(t) for t in choice["token_ids"]]
        content = (choice.get("logprobs") or {}).get("content") or []
        if len(content) != len(token_ids):
            raise ServerError(f"vLLM request {prompt_id!r}/{sample_index}: {len(content)} log-probs for "
                              f"{len(token_ids)} tokens (is the server running with --logprobs-mode raw_logprobs?)")
        logprobs = [float(c["logprob"]) for c in content]
        if params.stop and reason == "stop":
            k = VLLMEngine._stop_token_count(self, token_ids, params.stop)  # the in-process engine's rule
            token_ids, logprobs = token_ids[:k], logprobs[:k]
        text = self._decode(token_ids)
        cut = find_stop(text, params.stop)
        return Sample(prompt_id=prompt_id, sample_index=sample_index, text=text[:cut] if cut >= 0 else text,
                      token_ids=token_ids, finish_reason=reason, logprobs=logprobs, seed=seed,
                      weight_version=_version_of(choice))

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def close(self) -> None:
        """Stop the request threads and remove the last version file (a model's size; the servers loaded it)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self.push_folder is not None and self.version is not None:
            for f in self.push_folder.glob("v*.safetensors"):
                f.unlink(missing_ok=True)


def _push_ipc(clients: list[ServerClient], weights, version: int) -> None:
    """vLLM's own CUDA IPC trainer engine over its HTTP control client, one server at a time, then the version
    label; the weights stay on this process's GPU and the server maps them (same GPU)."""
    import requests
    import torch
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource
    from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
    from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

    pairs = [(k, v.detach().to("cuda").contiguous()) for k, v in weights]

    class _Pairs(WeightSource):
        def metadata(self):
            return [ParamMeta(k, v.dtype, tuple(v.shape)) for k, v in pairs]

        def __iter__(self):
            return iter(pairs)

    for c in clients:
        try:
            http = HTTPVLLMWeightSyncClient(c.url, timeout=c.push_timeout_s)
            WeightTransferTrainerFactory.trainer_init(IPCTrainerInitInfo(rank=0), client=http,
                                                      source=_Pairs()).send_weights()
        except requests.RequestException as e:
            raise ServerError(f"vLLM server {c.url}: ipc weight push failed ({type(e).__name__}: {e})") from None
        c._call("POST", "/update_weight_version", c.push_timeout_s, {"new_version": str(version)})
        if c.weight_version() != str(version):
            raise ServerError(f"vLLM server {c.url}: reports weight version {c.weight_version()!r} after the push "
                              f"of {version}")
    torch.cuda.synchronize()


def _need_cuda(backend: str) -> None:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(f"weight push backend {backend!r} needs CUDA (trainer and servers on GPUs); "
                           f"on CPU use 'file' or 'gloo'")


def rendezvous_address(server_url: str) -> str:
    """The address a server's workers reach the trainer's push group at: `RLVR_PUSH_ADDRESS` if set, else
    127.0.0.1 for a server on this machine, else this machine's host address."""
    if os.environ.get("RLVR_PUSH_ADDRESS"):
        return os.environ["RLVR_PUSH_ADDRESS"]
    if urlparse(server_url).hostname in ("127.0.0.1", "localhost", "::1"):
        return "127.0.0.1"
    return socket.gethostbyname(socket.gethostname())


def collective_init_info(backend: str, world_size: int, timeout_s: float, port: int | None = None,
                         address: str = "127.0.0.1"):
    """The trainer-side init info of a gloo or nccl push into one server: rank 0 of `world_size` (1 + the
    server's workers), rendezvous at `address` on a free port."""
    port = port or _free_port()
    if backend == "gloo":
        from rlvr_core.sampling.vllm_push import GlooTrainerInitInfo

        return GlooTrainerInitInfo(master_address=address, master_port=port, world_size=world_size,
                                   timeout_s=timeout_s, rank=0)
    if backend == "nccl":
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        return NCCLTrainerInitInfo(master_address=address, master_port=port, world_size=world_size, rank=0)
    raise ValueError(f"{backend!r} is not a collective weight push backend; known: {list(COLLECTIVE_BACKENDS)}")


class _CollectivePush:
    """One server's collective push (gloo or vLLM's nccl) through vLLM's trainer engine factory: the group is
    built at the first push; each push sends every tensor under a deadline of the push timeout, then labels
    the version and checks that the server reports it. After a failure the group is unusable (a peer may be
    stuck inside a broadcast): the push raises ServerError naming the server."""

    def __init__(self, client: ServerClient, backend: str, world_size: int) -> None:
        self.client, self.backend, self.world_size = client, backend, world_size
        self.pairs: list = []
        self.trainer = None
        self.broken: str | None = None

    def _source(self):
        from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

        owner = self

        class _Pairs(WeightSource):  # reads the current version's pairs each round
            def metadata(self):
                return [ParamMeta(k, v.dtype, tuple(v.shape)) for k, v in owner.pairs]

            def __iter__(self):
                return iter(owner.pairs)

        return _Pairs()

    def push(self, pairs, version: int) -> None:
        c = self.client
        if self.broken:
            raise ServerError(f"vLLM server {c.url}: its {self.backend} transfer group failed earlier ({self.broken})")
        self.pairs = [(k, v.to("cuda")) for k, v in pairs] if self.backend == "nccl" else pairs
        try:
            _with_deadline(self._send, c.push_timeout_s * 2)  # rendezvous and broadcast: one timeout each
        except Exception as e:  # noqa: BLE001 - any failure leaves the group unusable
            self.broken = f"{type(e).__name__}: {str(e)[:200]}"
            raise ServerError(f"vLLM server {c.url}: {self.backend} weight push of version {version} failed "
                              f"({self.broken}); its transfer group is unusable") from None
        c._call("POST", "/update_weight_version", c.push_timeout_s, {"new_version": str(version)})
        got = c.weight_version()
        if got != str(version):
            raise ServerError(f"vLLM server {c.url}: reports weight version {got!r} after the push of {version}")

    def _send(self) -> None:
        from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

        import rlvr_core.sampling.vllm_push  # noqa: F401 - registers the gloo trainer engine

        if self.trainer is None:
            info = collective_init_info(self.backend, self.world_size, self.client.push_timeout_s,
                                        address=rendezvous_address(self.client.url))
            http = HTTPVLLMWeightSyncClient(self.client.url, timeout=self.client.push_timeout_s)
            self.trainer = WeightTransferTrainerFactory.trainer_init(info, client=http, source=self._source())
        self.trainer.send_weights()
        if self.backend == "nccl":
            import torch

            torch.cuda.synchronize()


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


def _version_of(choice: dict) -> int | None:
    """The one weight version that sampled every token of a choice (None when the server labels none); a
    choice whose tokens span two versions (weights changed mid-request) is refused."""
    spans = choice.get("weight_versions") or []
    versions = {s["version"] for s in spans}
    if not versions:
        return None
    if len(versions) > 1:
        raise ServerError(f"one completion was sampled by weight versions {sorted(versions)}")
    v = versions.pop()
    try:
        return int(v)
    except (TypeError, ValueError):
        return None
