"""`vllm-server` engine: the same sampling interface over HTTP, on one or more `vllm serve` processes.

Generation gets processes (and, on a GPU cluster, devices) of its own; the trainer pushes each new policy
version into the servers through vLLM's weight-transfer routes, by the transport `push` names
(`rlvr_core/sampling/weight_push/`: file, gloo, nccl, ipc). Everything the in-process `vllm` engine promises
holds here too, because the request is the same: prompts tokenized by our tokenizer, one request per
(prompt, sample index) with its own seed, raw log-probs of the sampled token, the hf engine's eos ids, our
own decode and stop-string cut. The route is vLLM's token-in/token-out `/inference/v1/generate`, which also
reports the weight version that sampled each token; `Sample.weight_version` records it.

Every HTTP call has a timeout, and a failure names the server (`vllm_client.py`): a dead or hung server ends
the step with `ServerError`, never a hang. Requests are spread over the servers by prompt: every sample of one
prompt goes to one server (its prefix cache reuses the prompt, and one server's weights sample the whole
group), prompts round-robin from the first server in input order; all requests are sent concurrently (vLLM
batches them).
The seeds are per request, so which server sampled a prompt does not change its samples. No vLLM import
here: the client needs only `requests` and the tokenizer.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable

from rlvr_core.core.seeding import request_seed
from rlvr_core.experiment.push_config import push_config
from rlvr_core.sampling.base import Sample, SamplingParams, check_prompt_ids, find_stop
from rlvr_core.sampling.vllm import VLLMEngine, _eos_ids, to_vllm_sampling_kwargs
from rlvr_core.sampling.vllm_client import ServerClient, ServerError
from rlvr_core.sampling.weight_push import make_transport

__all__ = ["ServerError", "ServerClient", "VLLMServerEngine"]

_NO_LOGPROB_TEXT = "rlvr_no_logprob_text"


class VLLMServerEngine:
    """Sampling engine over `vllm serve` processes (see the module docstring).

    servers: their URLs. model_dir: the served model's folder (tokenizer, generation config for the eos ids).
    push: how weights reach the servers, a `sampling.push` config, mapping or type name (default `file` with
    no folder: no pushes, the servers keep what they loaded); its `timeout_s` bounds each call of a push.
    max_concurrency: requests in flight at once, over all servers.
    """

    name = "vllm-server"

    def __init__(self, servers: list[str], model_dir: str | Path, *, tokenizer=None, add_special_tokens: bool = True,
                 push: Any = None, request_timeout_s: float = 300.0, max_concurrency: int = 64,
                 pad_token_id: int | None = None):
        if not servers:
            raise ValueError("vllm-server engine needs at least one server URL")
        push = push_config(push)
        self.clients = [ServerClient(u, request_timeout_s, push.timeout_s) for u in servers]
        self._pool = ThreadPoolExecutor(max_workers=max(max_concurrency, len(self.clients)),
                                        thread_name_prefix="rlvr-vllm-server")
        self.transport = make_transport(push, self.clients, self._pool)
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        self.tokenizer = tokenizer
        self.add_special_tokens = add_special_tokens
        self.eos_token_ids = frozenset(_eos_ids(model_dir, tokenizer))
        pad = pad_token_id if pad_token_id is not None else tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else (tokenizer.eos_token_id or 0))
        self.version: int | None = None  # the last version pushed
        self.push_seconds: list[float] = []

    # ---- weights ---------------------------------------------------------------------------------------
    def push_weights(self, weights: Iterable[tuple[str, "object"]], version: int) -> float:
        """Load `version` into every server through the transport; seconds taken. A server that fails, does
        not answer within the push timeout or then reports another version raises ServerError naming it."""
        t0 = time.perf_counter()
        self.transport.push(weights, version)
        self.version = version
        self.push_seconds.append(time.perf_counter() - t0)
        return self.push_seconds[-1]

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
        check_prompt_ids(prompts, prompt_ids)
        encoded = [self.tokenizer(p, add_special_tokens=self.add_special_tokens)["input_ids"] for p in prompts]
        return self.generate_ids(encoded, prompt_ids, params, step=step, epoch=epoch,
                                 first_sample_index=first_sample_index, clients=clients)

    def generate_ids(self, prompt_token_ids: list[list[int]], prompt_ids: list[str], params: SamplingParams, *,
                     step: int = 0, epoch: int = 0, first_sample_index: int = 0,
                     clients: list[ServerClient] | None = None) -> list[list[Sample]]:
        """`generate` on prompts given as token ids (the server's endpoint takes ids: nothing is re-encoded); each
        sample's `prompt_token_ids` are the ids the server reports it conditioned on."""
        clients = clients or self.clients
        check_prompt_ids(prompt_token_ids, prompt_ids)
        jobs = []
        for i, (ids, pid) in enumerate(zip(prompt_token_ids, prompt_ids)):
            if len(ids) == 0:
                raise ValueError(f"prompt {pid!r} encodes to zero tokens")
            for s in range(first_sample_index, first_sample_index + params.n):
                jobs.append((i, s, request_seed(params.seed, pid, step, s, epoch=epoch), [int(t) for t in ids]))
        futures = [self._pool.submit(clients[i % len(clients)].generate, ids, self._request_params(params, seed))
                   for (i, _, seed, ids) in jobs]
        result: list[list[Sample]] = [[] for _ in prompt_token_ids]
        for (i, s, seed, ids), fut in zip(jobs, futures):
            choice = fut.result()
            sample = self._to_sample(choice, prompt_ids[i], s, seed, params)
            reported = choice.get("prompt_token_ids")
            sample.prompt_token_ids = [int(t) for t in reported] if reported is not None else ids
            result[i].append(sample)
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
        """Stop the request threads and let the transport clean up (the file transport's last version file)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.transport.close()


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
