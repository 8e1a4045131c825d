"""gsm8k verifier: hand-worked extraction cases and the full real GSM8K data (every gold vs itself)."""

import re

import pytest
from verifier_data import read_jsonl

from rlvr_core.verifiers import Status, get_verifier

FLEX = get_verifier("gsm8k")
STRICT = get_verifier("gsm8k", mode="strict")


@pytest.mark.parametrize(
    "response, gold, extracted",
    [
        (" 3 + 4 = 7\n5 * 7 = 35\n#### 35", "35", "35"),  # the demo's format
        ("She pays $1,234 in total.", "1234", "1,234"),  # thousands separator, "$", trailing period
        ("The total is 1,234,567 dollars", "#### 1,234,567", "1,234,567"),
        ("So it weighs 27.0 kg.", "27", "27.0"),  # trailing .0 and a unit
        ("The temperature fell to -5 degrees.", "-5", "-5"),
        ("The temperature fell to \u22125 degrees.", "-5", "\u22125"),  # unicode minus
        ("7-2=5", "5", "5"),  # "-" between numbers is subtraction, not a sign
        ("It costs $0.50 each", "0.5", "0.50"),
        ("He has 12 apples and eats 3, so 9 remain.", 9, "9"),  # int gold
        ("Answer: 12.5", 12.5, "12.5"),  # float gold
    ],
)
def test_flexible_accepts(response, gold, extracted):
    o = FLEX.verify(response, gold)
    assert (o.status, o.reward, o.extracted) == (Status.CORRECT, 1.0, extracted)


@pytest.mark.parametrize(
    "response, gold",
    [
        ("#### 36", "35"),
        ("35 apples, then 2 more", "35"),  # last number wins
        ("1,234", "1,235"),
        ("The answer is 3.5", "35"),
        ("-35", "35"),
    ],
)
def test_flexible_rejects(response, gold):
    o = FLEX.verify(response, gold)
    assert (o.status, o.reward) == (Status.INCORRECT, 0.0)


def test_no_number_is_no_answer_not_incorrect():
    o = FLEX.verify("I do not know.", "35")
    assert (o.status, o.reward, o.extracted) == (Status.NO_ANSWER, 0.0, None)


def test_strict_needs_the_marker():
    assert STRICT.verify("so 5 * 7 = 35", "35").status is Status.NO_ANSWER
    assert STRICT.verify("5 * 7 = 35. The answer is 35.", "35").status is Status.CORRECT
    assert STRICT.verify("#### $1,200", "#### 1,200").status is Status.CORRECT
    # the last marker is the one read, and numbers after it do not count in strict mode
    o = STRICT.verify("#### 35\nthen 99 more words", "35")
    assert (o.status, o.extracted) == (Status.CORRECT, "35")
    # two different final answers score 0 whichever is last (answer spraying: test_reward_hacks_answers.py)
    o = STRICT.verify("#### 4\nwait, no\n#### 35\nthen 99 more words", "35")
    assert (o.status, o.extracted, o.extra["several_answers"]) == (Status.INCORRECT, "35", True)
    # flexible reads the trailing number on the same text
    assert FLEX.verify("#### 4\nwait, no\n#### 35\nthen 99 more words", "35").status is Status.INCORRECT


def test_continuation_after_answer_is_flagged():
    # BUGZOO G-stop-seq: the model starts a new question after its answer
    o = FLEX.verify("5 * 7 = 35\n#### 35\n\nQuestion: Tom has 4 cats", "35")
    assert o.status is Status.INCORRECT and o.extracted == "4"
    assert o.extra["continued_after_answer"] is True
    assert STRICT.verify("5 * 7 = 35\n#### 35\n\nQuestion: Tom has 4 cats", "35").status is Status.CORRECT


def test_format_reward_is_off_by_default_and_shapes_when_on():
    assert FLEX.verify("#### 36", "35").reward == 0.0
    shaped = get_verifier("gsm8k", format_reward=0.1)
    assert shaped.verify("#### 36", "35").reward == 0.1  # right format, wrong number
    assert shaped.verify("36", "35").reward == 0.0  # neither
    assert shaped.verify("#### 35", "35").reward == 1.0


@pytest.mark.parametrize("gold", [None, True, ["35"], "no number here"])
def test_bad_gold_raises_so_the_pool_reports_error(gold):
    with pytest.raises((TypeError, ValueError)):
        FLEX.verify("#### 35", gold)


def test_bad_mode_is_refused():
    with pytest.raises(ValueError):
        get_verifier("gsm8k", mode="lenient")


@pytest.mark.parametrize("split", ["train", "test"])
def test_every_real_gold_solution_verifies_against_its_own_answer(split):
    rows = read_jsonl(f"gsm8k/{split}.jsonl")
    assert len(rows) > 1000
    for row in rows:
        answer_text = row["answer"]
        final = answer_text.rsplit("####", 1)[1].strip()
        for v in (FLEX, STRICT):
            # gold as the full answer text, and as the bare final number
            assert v.verify(answer_text, answer_text).status is Status.CORRECT, answer_text
            assert v.verify(answer_text, final).status is Status.CORRECT, answer_text


def test_real_answers_with_one_added_are_rejected():
    rows = read_jsonl("gsm8k/test.jsonl")
    for row in rows[:300]:
        final = row["answer"].rsplit("####", 1)[1].strip()
        wrong = int(final.replace(",", "")) + 1
        body = re.sub(r"####.*$", f"#### {wrong}", row["answer"])
        assert FLEX.verify(body, row["answer"]).status is Status.INCORRECT
        assert STRICT.verify(body, final).status is Status.INCORRECT
