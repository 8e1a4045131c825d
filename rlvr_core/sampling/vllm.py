"""`vllm` engine: the same interface on vLLM, for GPU machines (optional extra `rlvr[vllm]`).

vLLM is a CUDA-only wheel, so it is imported inside `VLLMEngine.__init__`, never at module import; the
translation of our settings into vLLM's `SamplingParams` is a pure function, `to_vllm_sampling_kwargs`,
tested on machines without vLLM.

Choices that keep the two engines' outputs comparable:
  * one vLLM request per (prompt, sample index), each with n=1 and its own seed from
    `rlvr_core.seeding.request_seed` (vLLM's prefix cache shares the prompt's prefill between them);
  * `logprobs=0` asks for the sampled token's log-prob only, and the engine is created with
    `logprobs_mode="raw_logprobs"` (vLLM's default since it has the option): log_softmax of the raw model
    logits, before temperature/top-k/top-p, the same definition as `Sample.logprobs`;
  * stop strings are cut from the text (`include_stop_str_in_output=False`) while the token ids keep
    the tokens that were generated, as in the `hf` engine;
  * `top_k` 0 means "disabled" in both our settings and vLLM >= 0.32 (older vLLM wanted -1).
"""

from __future__ import annotations

from rlvr_core.sampling.base import Sample, SamplingParams, check_prompt_ids
from rlvr_core.seeding import request_seed

__all__ = ["VLLMEngine", "to_vllm_sampling_kwargs"]


def to_vllm_sampling_kwargs(params: SamplingParams, seed: int) -> dict:
    """Keyword arguments for `vllm.SamplingParams` for ONE sample of one prompt (n is always 1)."""
    return {
        "n": 1,
        "temperature": float(params.temperature),  # 0 -> vLLM's greedy path (top_p/top_k ignored)
        "top_p": float(params.top_p),
        "top_k": int(params.top_k),                # 0 = disabled
        "max_tokens": int(params.max_new_tokens),
        "stop": list(params.stop),
        "include_stop_str_in_output": False,
        "seed": int(seed),
        "logprobs": 0,                             # the sampled token's log-prob only
        "skip_special_tokens": True,
        "detokenize": True,
    }


class VLLMEngine:
    """Sampling engine on `vllm.LLM`.

    model: a model folder or hub id (or an already built `vllm.LLM`, passed as `llm=`).
    llm_kwargs: passed to `vllm.LLM` (e.g. dtype, gpu_memory_utilization, max_model_len).
    """

    name = "vllm"

    def __init__(self, model: str | None = None, *, llm=None, **llm_kwargs):
        try:
            import vllm
        except ImportError as e:
            raise ImportError(
                "the 'vllm' sampling engine needs vLLM, a CUDA-only package: install the optional extra "
                "`pip install rlvr[vllm]` on a GPU machine, or use get_engine('hf', ...) on CPU"
            ) from e
        self._vllm = vllm
        if llm is None:
            if model is None:
                raise ValueError("VLLMEngine needs a model path/id or an llm=vllm.LLM(...)")
            llm_kwargs.setdefault("logprobs_mode", "raw_logprobs")
            llm = vllm.LLM(model=model, **llm_kwargs)
        self.llm = llm

    def generate(self, prompts: list[str], prompt_ids: list[str], params: SamplingParams, *,
                 step: int = 0, epoch: int = 0, first_sample_index: int = 0) -> list[list[Sample]]:
        check_prompt_ids(prompts, prompt_ids)
        keys, req_prompts, req_params = [], [], []
        for i, (prompt, pid) in enumerate(zip(prompts, prompt_ids)):
            for s in range(first_sample_index, first_sample_index + params.n):
                seed = request_seed(params.seed, pid, step, s, epoch=epoch)
                keys.append((i, s, seed))
                req_prompts.append(prompt)
                req_params.append(self._vllm.SamplingParams(**to_vllm_sampling_kwargs(params, seed)))
        outputs = self.llm.generate(req_prompts, sampling_params=req_params, use_tqdm=False)

        result: list[list[Sample]] = [[] for _ in prompts]
        for (i, s, seed), req_out in zip(keys, outputs):
            o = req_out.outputs[0]
            if o.finish_reason not in ("stop", "length"):
                raise RuntimeError(f"vLLM request {prompt_ids[i]!r}/{s} finished with {o.finish_reason!r}")
            token_ids = list(o.token_ids)
            logprobs = [float(step_lp[tok].logprob) for tok, step_lp in zip(token_ids, o.logprobs)]
            result[i].append(Sample(prompt_id=prompt_ids[i], sample_index=s, text=o.text, token_ids=token_ids,
                                    finish_reason=o.finish_reason, logprobs=logprobs, seed=seed))
        return result
