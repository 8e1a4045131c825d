"""math verifier: real MATH-500 gold solutions, equivalent forms, wrong answers, both modes. Agreement with a
plain math-verify loop (the library we build on) on MATH-500 answers rewritten into other forms and wrong
values: test_verifier_peers.py."""

import pytest
from math_verify import parse, verify
from verifier_data import read_jsonl

from rlvr_core.verifiers import Status, get_verifier
from rlvr_core.verifiers.final_answer import last_boxed

LENIENT = get_verifier("math")
BOXED = get_verifier("math", mode="boxed")


@pytest.fixture(scope="module")
def math500():
    return read_jsonl("math500/test.jsonl")


def test_every_math500_gold_solution_verifies_against_its_answer(math500):
    # Exceptions would be listed in docs/verifiers.md; with math-verify 0.9.0 there are none.
    for mode, v in (("lenient", LENIENT), ("boxed", BOXED)):
        failures = [(r["unique_id"], r["answer"], v.verify(r["solution"], r["answer"])) for r in math500]
        failures = [f for f in failures if f[2].status is not Status.CORRECT]
        assert failures == [], (mode, failures)


def test_math500_answers_against_a_different_answer_are_rejected(math500):
    # Pair each solution with the next problem's answer; skip the pairs whose answers are equal
    # according to math-verify itself (independent judge of "really different").
    checked = 0
    for r, other in zip(math500, math500[1:]):
        if verify(parse("\\boxed{" + other["answer"] + "}"), parse("\\boxed{" + r["answer"] + "}")):
            continue
        assert LENIENT.verify(r["solution"], other["answer"]).status is Status.INCORRECT, (r["unique_id"], other["answer"])
        checked += 1
    assert checked > 450


@pytest.mark.parametrize(
    "response, gold",
    [
        ("$\\boxed{\\frac{1}{2}}$", "0.5"),
        ("$\\boxed{0.5}$", "\\frac{1}{2}"),
        ("$\\boxed{1/2}$", "\\frac12"),
        ("$\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}$", "(3, \\pi/2)"),
        ("$\\boxed{(3, \\pi/2)}$", "\\left( 3, \\frac{\\pi}{2} \\right)"),
        ("$\\boxed{27.0}$", "27"),
        ("$\\boxed{27}$", "27.0"),
        ("$\\boxed{x^2+2x+1}$", "(x+1)^2"),
        ("$\\boxed{\\{1,2\\}}$", "\\{2,1\\}"),
        ("$\\boxed{\\sqrt{2}/2}$", "\\frac{\\sqrt{2}}{2}"),
        ("solution text ... \\boxed{\\frac{3}{4}} ...", "The answer is therefore $\\boxed{0.75}$."),  # gold as solution
    ],
)
def test_equivalent_forms_are_accepted_in_both_modes(response, gold):
    for v in (LENIENT, BOXED):
        assert v.verify(response, gold).status is Status.CORRECT, v.mode


@pytest.mark.parametrize(
    "response, gold",
    [
        ("$\\boxed{\\frac{1}{3}}$", "0.5"),
        ("$\\boxed{(3, \\pi)}$", "\\left( 3, \\frac{\\pi}{2} \\right)"),
        ("$\\boxed{x^2+1}$", "(x+1)^2"),
        ("$\\boxed{28}$", "27"),
        ("$\\boxed{-2}$", "2"),
    ],
)
def test_wrong_answers_are_rejected(response, gold):
    for v in (LENIENT, BOXED):
        assert v.verify(response, gold).status is Status.INCORRECT


def test_lenient_uses_fallbacks_that_boxed_refuses():
    minerva = "Final Answer: The final answer is $\\frac{1}{2}$. I hope it is correct."
    assert LENIENT.verify(minerva, "0.5").status is Status.CORRECT
    assert BOXED.verify(minerva, "0.5").status is Status.NO_ANSWER
    last_dollar = "We compute and get $x = 4$, so the value is $12$"
    assert LENIENT.verify(last_dollar, "12").status is Status.CORRECT
    assert BOXED.verify(last_dollar, "12").status is Status.NO_ANSWER
    assert LENIENT.verify("I cannot solve this.", "12").status is Status.NO_ANSWER


def test_last_boxed_handles_nesting_and_variants():
    assert last_boxed("a \\boxed{1} b \\boxed{\\frac{a}{\\sqrt{b}}} c") == "\\frac{a}{\\sqrt{b}}"
    assert last_boxed("\\fbox{7}") == "7"
    assert last_boxed("$\\boxed 5$") == "5"
    assert last_boxed("\\boxed{unclosed") is None
    assert last_boxed("no box") is None


def test_bad_inputs_raise_so_they_count_as_errors():
    with pytest.raises(TypeError):
        LENIENT.verify("\\boxed{1}", None)
    with pytest.raises(ValueError):
        LENIENT.verify("\\boxed{1}", "\\boxed{")  # unparseable gold


def test_format_reward_only_for_a_boxed_wrong_answer():
    shaped = get_verifier("math", format_reward=0.1)
    assert shaped.verify("$\\boxed{3}$", "4").reward == 0.1
    assert shaped.verify("the value is $3$", "4").reward == 0.0
    assert shaped.verify("$\\boxed{4}$", "4").reward == 1.0
