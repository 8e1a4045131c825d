"""Responses from the data set, evaluations and rollouts become teacher-forced sequences the way the
sampler and trainer tokenized them."""

from __future__ import annotations

import pytest

from rlvr_core.data.templates import get_template
from rlvr_core.probe.inputs import encode_pair, sequences_from_records, sequences_from_rollouts, sequences_from_rows
from rlvr_core.probe.token_stats import ProbeSequence, teacher_forced_stats


def test_sources(tokenizer, rows):
    r = rows["test"][0]
    prompt = get_template("qa").render(r["question"])
    ref = sequences_from_rows([r], tokenizer, "qa")[0]
    p, resp = encode_pair(tokenizer, prompt, " " + r["answer"], append_eos=True)
    assert (list(ref.prompt_ids), list(ref.response_ids)) == (p, resp) and resp[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(ref.response_ids, skip_special_tokens=True) == " " + r["answer"]
    # eval_samples rows: a greedy and a sampled row share sample_index 0 and stay distinct
    evals = [{"problem_id": r["id"], "sample_index": 0, "greedy": True, "response": " 1 + 2 = 3", "status": "correct"},
             {"problem_id": r["id"], "sample_index": 0, "greedy": False, "response": " 4", "status": "incorrect"}]
    seqs = sequences_from_records(evals, {r["id"]: r}, tokenizer, "qa", source="eval")
    assert [s.sequence_id for s in seqs] == [f"{r['id']}/eval/greedy/0", f"{r['id']}/eval/0"]
    assert [s.meta["correct"] for s in seqs] == [True, False] and seqs[0].prompt_ids == ref.prompt_ids
    with pytest.raises(KeyError, match="no such problem"):
        sequences_from_records([{"problem_id": "nope", "response": "x"}], {}, tokenizer, "qa", source="eval")
    roll = sequences_from_rollouts([{"prompt_id": r["id"], "prompt": prompt, "completion": " 5", "step": 3,
                                     "sample_index": 2, "status": "correct"}], tokenizer)[0]
    assert roll.prompt_ids == ref.prompt_ids and roll.sample_index == 2 and roll.meta == {"step": 3, "correct": True}


def test_duplicate_ids_and_empty_prompt_refused(model_a, tokenizer, rows):
    s = sequences_from_rows(rows["test"][:1], tokenizer, "qa")[0]
    with pytest.raises(ValueError, match="unique"):
        teacher_forced_stats(model_a, {"b": model_a}, [s, s])
    with pytest.raises(ValueError, match="empty prompt"):
        ProbeSequence("x", "p", (), (1, 2))
