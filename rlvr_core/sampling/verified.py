"""Sample n completions per problem and verify each against the problem's gold answer: the pass-rate
stage, the GRPO trainer's held-out check and the probes all score samples this one way."""

from __future__ import annotations

from typing import Any

from rlvr_core.core.progress import SILENT, Progress
from rlvr_core.data import gold_of
from rlvr_core.data.templates import get_template
from rlvr_core.sampling.base import SamplingParams, unique_fraction
from rlvr_core.verifiers.pool import VerifierPool
from rlvr_core.verifiers.registry import default_workers

__all__ = ["sample_and_verify"]


def sample_and_verify(model, tokenizer, rows: list[dict], *, template_id: str, n: int, temperature: float,
                      top_p: float, max_new_tokens: int, seed: int, batch_size: int, verifier: str,
                      verifier_mode: str | None, verifier_workers: int | None, verifier_timeout_s: float,
                      step: int = 0, progress: Progress = SILENT, stage: str = "sample",
                      engine: Any = None) -> list[dict]:
    """n completions per problem, each verified against the problem's gold answer.

    engine: a built sampling engine (`rlvr_core.eval.evaluate.build_engine`); default an `HFEngine` on model
    and tokenizer. verifier_workers None: the verifier's default (`verifiers.registry.default_workers`).

    Returns one record per sample: problem_id, sample_index, response, extracted, status, reward,
    correct, finish_reason, length (generated tokens), seed, unique_frac (of the problem's group).
    """
    from rlvr_core.sampling.hf import HFEngine  # torch

    template = get_template(template_id)
    engine = engine if engine is not None else HFEngine(model, tokenizer, batch_size=batch_size)
    params = SamplingParams(n=n, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                            stop=template.stop, seed=seed)
    groups = []
    chunk = max(1, batch_size // n)
    for i in range(0, len(rows), chunk):
        part = rows[i:i + chunk]
        groups += engine.generate([template.render(r["question"]) for r in part], [r["id"] for r in part],
                                  params, step=step)
        progress(stage, f"sampled {min(i + chunk, len(rows))}/{len(rows)} problems × {n}", every_s=5.0)
    options = {"mode": verifier_mode} if verifier_mode else {}
    pairs = [(s.text, gold_of(r)) for r, g in zip(rows, groups) for s in g]
    workers = default_workers(verifier) if verifier_workers is None else verifier_workers
    with VerifierPool(verifier, options, workers=workers, timeout_s=verifier_timeout_s) as pool:
        outcomes = pool.verify_many(pairs)
        verifier_version = pool.version
    records, it = [], iter(outcomes)
    for r, g in zip(rows, groups):
        uf = unique_fraction(g)
        for s in g:
            o = next(it)
            records.append({
                "problem_id": r["id"], "sample_index": s.sample_index, "response": s.text,
                "extracted": o.extracted, "status": o.status.value, "reward": float(o.reward),
                "correct": o.status.value == "correct", "finish_reason": s.finish_reason,
                "length": len(s.token_ids), "seed": s.seed, "unique_frac": uf,
                "verifier": verifier, "verifier_version": verifier_version,
            })
    return records
