"""The task a probe samples and verifies on: template, verifier and decoding settings in one place.

Sampling goes through `rlvr_core.sampling.verified.sample_and_verify` (the evaluator's own path: HFEngine with
per-request seeds, the template's stop strings, VerifierPool), so a probe's "A fails, B succeeds" is the
same judgement the evaluation made. `verify_texts` scores texts decoded elsewhere (the guided decoders
of `rlvr_core.probe.decoding`) with the same verifier and the same gold field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlvr_core.core.progress import SILENT
from rlvr_core.sampling.verified import sample_and_verify
from rlvr_core.verifiers.pool import VerifierPool
from rlvr_core.verifiers.registry import default_workers

__all__ = ["TaskSettings"]


@dataclass(frozen=True)
class TaskSettings:
    template_id: str = "qa"
    verifier: str = "gsm8k"
    verifier_mode: str | None = None
    max_new_tokens: int = 48
    top_p: float = 1.0
    seed: int = 0
    batch_size: int = 128
    verifier_workers: int | None = None  # None: the verifier's default (in-process for gsm8k, which cannot hang)
    verifier_timeout_s: float = 5.0

    def sample(self, model, tokenizer, rows: list[dict], *, n: int, temperature: float, stage: str = "probe",
               progress=None) -> list[dict]:
        """n verified completions per row (records of `sample_and_verify`)."""
        return sample_and_verify(model, tokenizer, rows, template_id=self.template_id, n=n, temperature=temperature,
                                 top_p=self.top_p, max_new_tokens=self.max_new_tokens, seed=self.seed,
                                 batch_size=self.batch_size, verifier=self.verifier, verifier_mode=self.verifier_mode,
                                 verifier_workers=self.verifier_workers, verifier_timeout_s=self.verifier_timeout_s,
                                 progress=progress or SILENT, stage=stage)

    def verify_texts(self, texts: list[str], golds: list[Any]) -> list[bool]:
        """Correct / not for each (text, gold) pair, with the task's verifier."""
        options = {"mode": self.verifier_mode} if self.verifier_mode else {}
        workers = default_workers(self.verifier) if self.verifier_workers is None else self.verifier_workers
        with VerifierPool(self.verifier, options, workers=workers,
                          timeout_s=self.verifier_timeout_s) as pool:
            return [o.status.value == "correct" for o in pool.verify_many(list(zip(texts, golds)))]
