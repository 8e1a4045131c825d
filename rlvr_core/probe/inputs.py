"""Turn responses (from a data set, an evaluation or rollouts) into teacher-forced `ProbeSequence`s.

The prompt is tokenized exactly like the sampling engine does (`tokenizer(prompt,
add_special_tokens=True)`, see `rlvr_core.sampling.hf.HFEngine`), the response separately with
`add_special_tokens=False`, and the two are concatenated: the same split the warm start and the GRPO
trainer use. A response known only as text is re-tokenized; this is the canonical tokenization of that
text, which may differ from the sampled ids when BPE had several ways to write it (the statistics are
then those of the text, which is what perplexity-style analyses want).

Sources:
  * `sequences_from_rows`: the data set's worked solutions (`" " + row["answer"]`, the warm start's
    completion format), source "reference".
  * `sequences_from_records`: records of `rlvr_core.sampling.verified.sample_and_verify` or rows of the
    `eval_samples` table (problem_id, sample_index, response), prompts rendered from the problem rows.
  * `sequences_from_rollouts`: rows of the trainer's rollouts.parquet (prompt_id, sample_index,
    prompt, completion), prompt text as sampled.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rlvr_core.data.templates import get_template
from rlvr_core.probe.token_stats import ProbeSequence

__all__ = ["encode_pair", "sequences_from_rows", "sequences_from_records", "sequences_from_rollouts"]


def encode_pair(tokenizer, prompt: str, response: str, *, append_eos: bool = False) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids) tokenized separately, as the sampler and trainer see them."""
    p = tokenizer(prompt, add_special_tokens=True)["input_ids"]
    r = tokenizer(response, add_special_tokens=False)["input_ids"] if response else []
    if append_eos:
        r = r + [tokenizer.eos_token_id]
    return list(p), list(r)


def sequences_from_rows(rows: Iterable[dict], tokenizer, template_id: str, *, source: str = "reference",
                        append_eos: bool = True) -> list[ProbeSequence]:
    """The problems' own worked solutions as responses (" " + answer, then eos like the warm start)."""
    t = get_template(template_id)
    out = []
    for r in rows:
        p, resp = encode_pair(tokenizer, t.render(r["question"]), " " + r["answer"], append_eos=append_eos)
        out.append(ProbeSequence(f"{r['id']}/{source}/0", r["id"], p, resp, 0, source))
    return out


def sequences_from_records(records: Iterable[Mapping], rows_by_id: Mapping[str, dict], tokenizer, template_id: str,
                           *, source: str, response_key: str = "response") -> list[ProbeSequence]:
    """Sampled responses (sample_and_verify records or eval_samples rows) with prompts rendered from the rows."""
    t = get_template(template_id)
    out = []
    for rec in records:
        row = rows_by_id.get(rec["problem_id"])
        if row is None:
            raise KeyError(f"response for problem {rec['problem_id']!r} but no such problem in the rows given")
        p, resp = encode_pair(tokenizer, t.render(row["question"]), rec[response_key])
        k = int(rec.get("sample_index", 0))
        src = f"{source}/greedy" if rec.get("greedy") else source  # eval_samples: greedy and sampled share index 0
        out.append(ProbeSequence(f"{rec['problem_id']}/{src}/{k}", rec["problem_id"], p, resp, k, src,
                                 {"correct": rec.get("correct", rec.get("status") == "correct")}))
    return out


def sequences_from_rollouts(rollouts: Iterable[Mapping], tokenizer, *, source: str = "rollout") -> list[ProbeSequence]:
    """Rows of the trainer's rollouts.parquet (prompt text kept there as sampled)."""
    out = []
    for rec in rollouts:
        p, resp = encode_pair(tokenizer, rec["prompt"], rec["completion"])
        sid = f"{rec['prompt_id']}/{source}/step{rec.get('step', 0)}/{rec.get('sample_index', 0)}"
        out.append(ProbeSequence(sid, rec["prompt_id"], p, resp, int(rec.get("sample_index", 0)), source,
                                 {"step": rec.get("step"), "correct": rec.get("status") == "correct"}))
    return out
