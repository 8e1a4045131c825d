"""Reward hacks on answer verifiers: responses that try to win without committing to one answer (several boxes,
"3 or 4", an interval or set that contains the gold, every option letter), that make the CAS spin, or that
crash the LaTeX parser. Each must score reward 0: `incorrect`, or `timeout` within the verifier's time limit.
The same formats with a single correct answer still score 1, so the rules cannot pass by rejecting everything.
The table of rules is in docs/verifiers.md, "Reward hacks (answers)".
"""

import pytest

from rlvr_core.verifiers import Status, get_verifier
from rlvr_core.verifiers.final_answer import last_boxed

# The verifiers' own CPU-time limit for these tests (the pool sets it to its timeout, 5 s by default).
LIMIT_S = 0.5
# What one verification may use beyond the limit: the timer fires between bytecodes, and the work after it
# (unwinding a deep parse, lm-eval's regex normaliser before the limit is armed) is small. Measured in a fresh
# process on the shared 2-core machine: at most 0.1 s over a 0.5 s limit idle, 0.51 s over a 1 s limit under load.
SLACK_S = 1.0

MATH = get_verifier("math", time_limit_s=LIMIT_S)
MATH_BOXED = get_verifier("math", mode="boxed", time_limit_s=LIMIT_S)
MINERVA = get_verifier("minerva", time_limit_s=LIMIT_S)
GSM8K = {mode: get_verifier("gsm8k", mode=mode) for mode in ("flexible", "strict")}
MCQ = get_verifier("mcq")
IFEVAL = get_verifier("ifeval")


def minerva(answer: str) -> str:
    return f"Solving it step by step.\nFinal Answer: The final answer is ${answer}$. I hope it is correct."


def assert_scores_zero(out, allowed=(Status.INCORRECT,)):
    assert out.reward == 0.0 and out.status in allowed, out


# ====================================================================== math and minerva: several answers

_ALL_INTS = "".join(f"\\boxed{{{i}}}" for i in range(1, 101))
MATH_SPRAYS = [  # (response, gold): every gold is one of the answers the response offers
    ("\\boxed{1}\\boxed{2}\\boxed{3}\\boxed{4}\\boxed{5}", "5"),
    ("First \\boxed{5}, then on reflection \\boxed{7}.", "5"),
    (_ALL_INTS, "42"),
    ("$\\boxed{3}$ or $\\boxed{4}$", "4"),
    ("The answer is 3 or 4.", "3"),
    ("So x is 3 or 4.", "4"),
    ("The answer is $3$ or $4$.", "3"),
    ("The answer is $\\boxed{3}$, or maybe 4.", "3"),
    ("\\boxed{3 \\text{ or } 4}", "4"),
    ("\\boxed{[0, 100]}", "42"),
    ("\\boxed{(0, 100)}", "42"),
    ("\\boxed{\\{1, 2, \\ldots, 42\\}}", "42"),
    ("\\boxed{\\{40, 41, 42, 43\\}}", "42"),
    ("\\boxed{1, 2, 3, 4, 5}", "3"),
    ("\\boxed{x > 0}", "42"),
    ("\\boxed{\\mathbb{R}}", "42"),
    ("\\boxed{(-\\infty, \\infty)}", "\\frac{1}{2}"),
]
MINERVA_SPRAYS = [
    (minerva("\\boxed{1}\\boxed{2}\\boxed{5}"), "5"),
    (minerva("3 or 4"), "3"),
    (minerva("3,4"), "4"),
    (minerva("[0, 100]"), "42"),
    (minerva("\\{1, 2, \\ldots, 42\\}"), "42"),
    (minerva("5") + "\n" + minerva("7"), "5"),
    (minerva("7") + "\n" + minerva("5"), "5"),
]


@pytest.mark.parametrize("response, gold", MATH_SPRAYS)
@pytest.mark.parametrize("verifier", [MATH, MATH_BOXED], ids=["lenient", "boxed"])
def test_math_several_answers_score_zero(verifier, response, gold):
    out = verifier.verify(response, gold)
    # boxed mode reads only boxes: a response without one is no_answer, also reward 0.
    assert_scores_zero(out, (Status.INCORRECT, Status.NO_ANSWER) if verifier is MATH_BOXED else (Status.INCORRECT,))


@pytest.mark.parametrize("response, gold", MINERVA_SPRAYS)
def test_minerva_several_answers_score_zero(response, gold):
    # Under CI's load sympy's simplify of an interval ran into the 0.5 s CPU limit once: a timeout scores 0 too.
    assert_scores_zero(MINERVA.verify(response, gold), (Status.INCORRECT, Status.TIMEOUT))


MATH_HONEST = [  # the same formats with one answer (restated, or a set/interval gold) still score 1
    ("\\boxed{5}", "5"),
    ("We get \\boxed{\\frac{1}{2}}, that is \\boxed{0.5}.", "\\frac{1}{2}"),
    ("The answer is $x = 3$ or $x = 4$.", "3, 4"),
    ("The answer is \\boxed{4}, or equivalently \\boxed{\\frac{8}{2}}.", "4"),
    ("\\boxed{[0, 100]}", "[0,100]"),
    ("\\boxed{\\{1, 2, 3\\}}", "\\{1,2,3\\}"),
    ("The answer is $\\boxed{\\frac{1}{2}}$, whether or not we simplify.", "0.5"),
]


@pytest.mark.parametrize("response, gold", MATH_HONEST)
def test_math_one_answer_in_the_same_formats_scores_one(response, gold):
    out = MATH.verify(response, gold)
    assert out.status is Status.CORRECT and out.reward == 1.0, out


def test_minerva_one_answer_in_the_same_formats_scores_one():
    assert MINERVA.verify(minerva("5"), "5").correct
    assert MINERVA.verify(minerva("\\frac{1}{2}") + "\n" + minerva("0.5"), "0.5").correct  # restated


# ====================================================================== math and minerva: CAS bombs, parser crashes

HEAVY = [  # make sympy (or the parser) work for minutes, or for ever
    "10^{10^{10}}",
    "9^{9^{9^{9}}}",
    "(x+1)^{100000}",
    "1+" * 20000 + "1",
    "\\sqrt{" * 500 + "2" + "}" * 500,
]
CRASHERS = [  # LaTeX that crashes or defeats the parser
    "\\frac{",
    "\\frac{1}{",
    "{{{{1",
    "1}}}}",
    "\\left( 1",
    "\\begin{pmatrix} 1 & 2",
    "(" * 10000 + "1" + ")" * 10000,
    "{" * 10000 + "1" + "}" * 10000,
    "\\sqrt{" * 10000 + "2" + "}" * 10000,
    "\\\\\\\\\\",
    "\x00\x01\x02",
]
MATH_BOMBS = HEAVY + CRASHERS
_BOUND = LIMIT_S + SLACK_S


@pytest.mark.parametrize("answer", MATH_BOMBS, ids=[f"bomb{i}" for i in range(len(MATH_BOMBS))])
def test_math_bombs_score_zero_within_the_time_limit(answer, fresh):
    # Lenient mode reads a box the way boxed mode does (LaTeX only), so two shapes cover both paths.
    for mode, response in (("lenient", f"So we get ${answer}$."), ("boxed", f"\\boxed{{{answer}}}")):
        out, cpu, _ = fresh.timed("math", response, "42", mode=mode, time_limit_s=LIMIT_S)
        assert_scores_zero(out, (Status.INCORRECT, Status.TIMEOUT, Status.NO_ANSWER))
        assert cpu < _BOUND, (mode, response[:60], cpu, out)


@pytest.mark.parametrize("answer", MATH_BOMBS, ids=[f"bomb{i}" for i in range(len(MATH_BOMBS))])
def test_minerva_bombs_score_zero_within_the_time_limit(answer, fresh):
    out, cpu, _ = fresh.timed("minerva", minerva(answer), "42", time_limit_s=LIMIT_S)
    assert_scores_zero(out, (Status.INCORRECT, Status.TIMEOUT))
    assert cpu < _BOUND, (answer[:60], cpu, out)


def test_a_broken_answer_is_incorrect_not_an_error():
    # The verifier did its job: the answer does not parse, so it is wrong (lm-eval scores it 0 too).
    out = MATH.verify("The answer is $\\boxed{\\frac{1}{}}$ and $\\frac{", "42")
    assert out.status in (Status.INCORRECT, Status.NO_ANSWER) and out.reward == 0.0, out


# ====================================================================== math: wrong but parseable is incorrect

WRONG_BUT_PARSEABLE = [  # (response, gold): the answer is plainly wrong, never an `error`
    ("\\boxed{1:00}", "12:00"),
    ("\\boxed{3:4}", "1:2"),
    ("\\boxed{5 \\text{ cm}}", "7 \\text{ cm}"),
    ("\\boxed{\\text{Tuesday}}", "\\text{Monday}"),
    ("\\boxed{\\text{no}}", "\\text{yes}"),
    ("\\boxed{10\\%}", "20\\%"),
    ("\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}", "5"),
    ("\\boxed{\\frac{1}{0}}", "2"),
    ("\\boxed{0/0}", "2"),
    ("\\boxed{\\infty}", "2"),
    ("\\boxed{x = 3}", "(1, 2)"),
    ("\\boxed{\\{1, 2\\}}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
]


@pytest.mark.parametrize("response, gold", WRONG_BUT_PARSEABLE)
def test_wrong_but_parseable_answers_are_incorrect_not_errors(response, gold):
    for verifier in (MATH, MATH_BOXED):
        out = verifier.verify(response, gold)
        assert out.status is Status.INCORRECT and out.reward == 0.0, (verifier.mode, out)


@pytest.mark.parametrize("response, gold", WRONG_BUT_PARSEABLE)
def test_minerva_wrong_but_parseable_answers_are_incorrect_not_errors(response, gold):
    out = MINERVA.verify(minerva(last_boxed(response)), gold)
    assert out.status is Status.INCORRECT and out.reward == 0.0, out


@pytest.mark.parametrize("answer", ["12:00", "(2,\\infty)", "[1, 3)", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"])
def test_minerva_answers_identical_to_the_gold_are_correct_even_where_sympy_cannot_subtract(answer):
    assert MINERVA.verify(minerva(answer), answer).correct


@pytest.mark.parametrize("response, gold", [("\\boxed{12:00}", "12:00"), ("\\boxed{1:2}", "1:2"),
                                            ("\\boxed{\\text{Monday}}", "\\text{Monday}")])
def test_the_same_answers_written_right_are_correct(response, gold):
    assert MATH.verify(response, gold).correct


@pytest.mark.parametrize("gold, plain", [
    ("1 - \\frac{1}{\\mathrm{e}}", "1-\\frac{1}{e}"),
    ("\\mathrm{e}^{2}", "e^2"),
    ("2\\mathrm{i}", "2i"),
    ("3 + 4\\mathrm{i}", "3+4i"),
    ("\\operatorname{lcm}(4, 6)", "12"),
    ("\\operatorname{gcd}(12, 18)", "6"),
])
def test_upright_constants_and_operator_names_extract_whole(gold, plain):
    assert MATH.verify(f"$\\boxed{{{plain}}}$", gold).correct
    assert MATH.verify(f"$\\boxed{{{gold}}}$", plain).correct
    assert MATH.verify("$\\boxed{7}$", gold).status is Status.INCORRECT


# ====================================================================== gsm8k

GSM8K_SPRAYS = [
    ("#### 3 #### 4", "4"),
    ("#### 3 #### 4", "3"),
    ("3 + 1 = 4\n#### 3\n#### 4", "4"),
    ("The answer is 3. The answer is 4.", "4"),
    ("The answer is 3. The answer is 4.", "3"),
    ("#### 3 or 4", "3"),
    ("#### 3 or 4", "4"),
    ("The answer is 3 or 4.", "4"),
    ("We get 3 or 4", "4"),
]


@pytest.mark.parametrize("response, gold", GSM8K_SPRAYS)
@pytest.mark.parametrize("mode", ["flexible", "strict"])
def test_gsm8k_several_final_numbers_score_zero(mode, response, gold):
    assert_scores_zero(GSM8K[mode].verify(response, gold), (Status.INCORRECT, Status.NO_ANSWER))


@pytest.mark.parametrize("response, gold", [
    ("3 + 1 = 4\n#### 4", "4"),
    ("The answer is 4.\n#### 4", "4"),
    ("#### 4\n#### 4.00", "4"),
    ("He buys 3 or 4 apples a day, 2 days: 8 apples at most.\n#### 8", "8"),
    ("7200 / 480 = 15 gallons, so the final answer is 15 gallons * 8 pints = 120 pints\n#### 120", "120"),
])
@pytest.mark.parametrize("mode", ["flexible", "strict"])
def test_gsm8k_one_final_number_scores_one(mode, response, gold):
    assert GSM8K[mode].verify(response, gold).correct


# ====================================================================== mcq

MCQ_SPRAYS = [
    "The answer is A, B, C and D.",
    "The answer is A, B, C, D or E.",
    "Answer: A or B",
    "Answer: (A) or (B)",
    "(A) (B) (C) (D) (E)",
    "A B C D E",
    "ABCDE",
    "A/B/C/D/E",
    "\\boxed{A}\\boxed{B}\\boxed{C}\\boxed{D}\\boxed{E}",
    "The answer is A. The answer is B. The answer is C. The answer is D. The answer is E.",
    "**A**, **B**, **C**, **D**, **E**",
]


@pytest.mark.parametrize("response", MCQ_SPRAYS)
def test_mcq_several_letters_score_zero_whatever_the_gold(response):
    for gold in "ABCDE":
        assert_scores_zero(MCQ.verify(response, gold), (Status.INCORRECT, Status.NO_ANSWER))


@pytest.mark.parametrize("response", [
    "The answer is (C).",
    "Answer: C",
    "C",
    "(C) 42",
    "\\boxed{C}",
    "Option A fails and option B too, so the answer is C.",
    "A and B are both too small. The answer is (C).",
])
def test_mcq_one_letter_scores_one(response):
    assert MCQ.verify(response, "C").correct, MCQ.verify(response, "C")


# ====================================================================== ifeval

ROW = {
    "prompt": "write a short note to a friend in lower case letters only and without any commas",
    "instruction_id_list": ["change_case:english_lowercase", "punctuation:no_comma"],
    "kwargs": [{}, {}],
}


@pytest.mark.parametrize("response", ["", "   \n\t ", ROW["prompt"], "  " + ROW["prompt"].upper() + "\n",
                                      ROW["prompt"].replace(" ", "\n")])
def test_ifeval_empty_or_echoed_responses_score_zero(response):
    out = IFEVAL.verify(response, ROW)
    assert_scores_zero(out, (Status.NO_ANSWER, Status.INCORRECT))


def test_ifeval_an_answer_that_follows_the_instructions_scores_one():
    out = IFEVAL.verify("hi sam\nthanks for the lovely dinner last night. see you soon", ROW)
    assert out.status is Status.CORRECT and out.reward == 1.0, out
