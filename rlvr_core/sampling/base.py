"""The sampling-engine interface: settings in, samples out, one meaning of every field for all engines.

Why one interface: rollouts for training, pass-rate filtering and evaluation all sample from a model,
on CPU with transformers (`hf`) or on GPU with vLLM (`vllm`). The trainer compares the log-probs it
computes with the ones the engine returned (BUGZOO G-logprob-temp), the evaluator reports truncation
from the finish reason (G-truncation) and the answer extractor must never read text past a stop
sequence (G-stop-seq), so these fields mean exactly the same thing whichever engine produced them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

__all__ = ["SamplingParams", "Sample", "SamplingEngine", "unique_fraction", "find_stop", "check_prompt_ids"]


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings shared by all engines.

    n: samples per prompt (each its own request with its own seed, see `rlvr_core.core.seeding`).
    temperature: 0 means greedy (argmax); otherwise logits are divided by it before top-k/top-p.
    top_p: nucleus mass in (0, 1]; 1 disables it.  top_k: keep the k most likely tokens; 0 disables it.
    max_new_tokens: cap on generated tokens; hitting it gives finish_reason "length".
    stop: stop strings, matched on the decoded completion text (normally the template's `stop`).
    seed: the *run* seed; per-request seeds are derived from it, the prompt id, step and sample index.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            raise TypeError("stop must be a tuple of strings, not a single string")
        object.__setattr__(self, "stop", tuple(self.stop))
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if any((not isinstance(s, str)) or s == "" for s in self.stop):
            raise ValueError(f"stop strings must be non-empty str, got {self.stop!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Sample:
    """One completion of one prompt.

    text: the decoded completion (special tokens skipped), cut just before the earliest occurrence of
        any stop string; the stop string itself is not included.
    token_ids: the generated token ids up to and including the token whose decoding completed the first
        stop string, or the eos token, or the last token when max_new_tokens was reached. So when a stop
        string ended the sample, `token_ids` decode to `text` + the stop string (+ whatever else the last
        token held); when eos ended it, the eos id is the last element. These are the tokens that were
        actually sampled, and the ones a trainer should score.
    finish_reason: "stop" for eos or a stop string, "length" when max_new_tokens tokens were generated
        without either (a stop string completed by the very last allowed token counts as "stop").
    logprobs: one float per element of token_ids: the RAW log-probability of that token under the model,
        log_softmax(logits)[token] at temperature 1, before temperature, top-k or top-p processing. This
        is what a trainer's forward pass over prompt + token_ids gives, whatever temperature sampled it.
    seed: the per-request seed that produced this sample.
    weight_version: the policy version (optimizer steps) whose weights sampled it, where the engine reports
        one (`vllm-server`); None otherwise.
    prompt_token_ids: the ids the sample was conditioned on, where the engine reports them (`hf`, and every
        engine's `generate_ids`): the multi-turn loop checks them against the trajectory it stored.
    loss_mask: a multi-turn trajectory's (rlvr_core/environments): 1 on the ids the policy wrote, 0 on the
        environment's; token_ids then hold every id after the first prompt, logprobs 0.0 on the environment's.
        None: every id is the policy's.
    env: a multi-turn trajectory's turns, tool calls, failed tool calls and why it ended (`end`); None otherwise.
    """

    prompt_id: str
    sample_index: int
    text: str
    token_ids: list[int]
    finish_reason: Literal["stop", "length"]
    logprobs: list[float]
    seed: int
    weight_version: int | None = None
    prompt_token_ids: list[int] | None = None
    loss_mask: list[int] | None = None
    env: dict | None = None


@runtime_checkable
class SamplingEngine(Protocol):
    def generate(self, prompts: list[str], prompt_ids: list[str], params: SamplingParams, *,
                 step: int = 0, epoch: int = 0, first_sample_index: int = 0) -> list[list[Sample]]:
        """Per prompt (in input order), params.n samples ordered by sample_index, the indices
        first_sample_index .. first_sample_index + n - 1 (each index has its own request seed)."""
        ...


def unique_fraction(samples: list[Sample]) -> float:
    """Distinct completion texts / number of samples in one prompt's group (1.0 = all differ).

    A group collapsing to 1/n is the symptom of one seed shared by every request (G-fixed-seed).
    """
    if not samples:
        raise ValueError("unique_fraction of an empty group")
    return len({s.text for s in samples}) / len(samples)


def find_stop(text: str, stop: tuple[str, ...]) -> int:
    """Index of the earliest occurrence of any stop string in text, or -1."""
    hits = [i for i in (text.find(s) for s in stop) if i >= 0]
    return min(hits) if hits else -1


def check_prompt_ids(prompts: list, prompt_ids: list[str]) -> None:
    """Seeds derive from prompt ids: a length mismatch or a repeated id would silently share samples."""
    if len(prompts) != len(prompt_ids):
        raise ValueError(f"{len(prompts)} prompts but {len(prompt_ids)} prompt ids")
    if len(set(prompt_ids)) != len(prompt_ids):
        seen, dup = set(), []
        for p in prompt_ids:
            if p in seen:
                dup.append(p)
            seen.add(p)
        raise ValueError(f"{len(dup)} repeated prompt ids (they would get identical seeds), e.g. {dup[:5]}")
