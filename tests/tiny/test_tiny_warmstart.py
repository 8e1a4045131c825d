"""Warm start on a small spec: loss goes down, the saved dir reloads like a hub model, same logits."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr_core.data.synthetic import SyntheticSpec, make_synthetic_dataset
from rlvr_core.tiny.warmstart import (WARMSTART_FILE, WarmStartSpec, evaluate_base, extract_final, save_tiny,
                                      train_tiny, warm_start)

SPEC = WarmStartSpec(steps=30, batch_size=16, lr=3e-3, seed=0, hidden_size=64, num_layers=2, heads=2, warmup_steps=5)


@pytest.fixture(scope="module")
def rows():
    return make_synthetic_dataset(SyntheticSpec(n_train=200, n_test=8, seed=0))


@pytest.fixture(scope="module")
def trained(rows):
    calls = []
    res = train_tiny(rows["train"], SPEC, progress=lambda s, n, l: calls.append((s, n, l)))
    return res, calls


def test_loss_goes_down_and_progress_called(trained):
    res, calls = trained
    assert [c[0] for c in calls] == [10, 20, 30] and all(c[1] == 30 for c in calls)
    assert res.meta["final_loss_avg20"] < 0.7 * res.meta["first_loss"]
    assert calls[-1][2] < res.meta["first_loss"]


def test_saved_dir_reloads_with_identical_logits(trained, tmp_path):
    res, _ = trained
    out = save_tiny(res, tmp_path / "base")
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    assert tok.padding_side == "left" and tok.pad_token_id != tok.eos_token_id
    assert model.generation_config.eos_token_id == tok.eos_token_id
    x = tok(["Question: Tom has 3 pens. He buys 4 more.\nAnswer:", "Question: x\nAnswer:"], return_tensors="pt",
            padding=True)  # fmt: skip
    with torch.no_grad():
        assert torch.equal(res.model(**x).logits, model(**x).logits)


def test_warm_start_writes_meta_and_is_deterministic(rows, trained, tmp_path):
    res, _ = trained
    calls = []
    out = warm_start(rows["train"], tmp_path / "ws", SPEC, progress=lambda *a: calls.append(a))
    meta = json.loads((out / WARMSTART_FILE).read_text())
    assert meta["spec"] == json.loads(json.dumps(res.meta["spec"]))
    assert meta["n_params"] == res.meta["n_params"] and meta["wall_time_s"] > 0
    assert meta["final_loss"] == pytest.approx(res.meta["final_loss"], rel=1e-4)
    assert len(calls) == 3
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    tok = AutoTokenizer.from_pretrained(out)
    x = tok(["Question: Ann has 9 cards. She loses 2.\nAnswer:"], return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(model(**x).logits, res.model(**x).logits, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError):
        warm_start([], tmp_path / "empty", SPEC)


def test_evaluate_base_runs(rows, trained, tmp_path):
    out = save_tiny(trained[0], tmp_path / "ev")
    res = evaluate_base(out, rows["test"], k=2, max_new_tokens=24)
    assert res["n"] == 8 and 0 <= res["greedy_acc"] <= res["pass@2"] <= 1


def test_extract_final():
    assert extract_final("3 + 4 = 7\n#### 7") == "7"
    assert extract_final("#### 1,234\n#### 5") == "5"
    assert extract_final("7") is None


def test_spec_is_frozen_with_defaults():
    s = WarmStartSpec()
    with pytest.raises(Exception):
        s.steps = 1  # type: ignore[misc]
    assert replace(s, steps=5).steps == 5 and s.batch_size > 0 and s.lr > 0


def test_weak_teacher_misreads_subtractions_and_carries_the_total():
    """teacher_answer, by hand: a misread step becomes an addition and every later line starts from the
    teacher's running total; rate 0 leaves the answer alone, rate 1 misreads every subtraction."""
    import random

    from rlvr_core.tiny.warmstart import teacher_answer

    gold = "9 - 4 = 5\n5 + 3 = 8\n8 - 2 = 6\n#### 6"
    assert teacher_answer(gold, 0.0, random.Random(0)) == gold
    assert teacher_answer(gold, 1.0, random.Random(0)) == "9 + 4 = 13\n13 + 3 = 16\n16 + 2 = 18\n#### 18"
    seen = {teacher_answer(gold, 0.5, random.Random(s)) for s in range(50)}
    assert seen == {gold, "9 + 4 = 13\n13 + 3 = 16\n16 - 2 = 14\n#### 14", "9 - 4 = 5\n5 + 3 = 8\n8 + 2 = 10\n#### 10",
                    "9 + 4 = 13\n13 + 3 = 16\n16 + 2 = 18\n#### 18"}
    assert teacher_answer("free text\n#### 3", 1.0, random.Random(0)) == "free text\n#### 3"
    # The hasty teacher drops the last step and answers with the total before it.
    assert teacher_answer(gold, 0.0, random.Random(0), stops_early=1.0) == "9 - 4 = 5\n5 + 3 = 8\n#### 8"
    assert teacher_answer(gold, 1.0, random.Random(0), stops_early=1.0) == "9 + 4 = 13\n13 + 3 = 16\n#### 16"
    assert teacher_answer("9 - 4 = 5\n#### 5", 0.0, random.Random(0), stops_early=1.0) == "9 - 4 = 5\n#### 5"
    early = [teacher_answer(gold, 0.0, random.Random(s), stops_early=0.7) for s in range(400)]
    assert set(early) == {gold, "9 - 4 = 5\n5 + 3 = 8\n#### 8"}
    assert abs(sum(a != gold for a in early) / len(early) - 0.7) < 0.07


def test_weak_teacher_share_of_misread_steps(rows):
    """Over the demo's training rows, the share of subtraction steps written as additions is the rate."""
    import random

    from rlvr_core.tiny.warmstart import teacher_answer

    rng, subs, misread = random.Random(0), 0, 0
    for r in rows["train"]:
        gold_ops = [ln.split()[1] for ln in r["answer"].split("\n")[:-1]]
        ops = [ln.split()[1] for ln in teacher_answer(r["answer"], 0.6, rng).split("\n")[:-1]]
        subs += gold_ops.count("-")
        misread += sum(g == "-" and o == "+" for g, o in zip(gold_ops, ops))
    assert subs > 100 and abs(misread / subs - 0.6) < 0.08
