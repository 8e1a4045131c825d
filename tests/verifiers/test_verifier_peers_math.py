"""Peer checks for `minerva` and `math` against graders that share no code with math-verify (which `math` is built
on, so comparing the two would be circular):

- minerva-ref: lm-evaluation-harness 0.4.13's own `minerva_math/utils.py` (`get_unnormalized_answer`,
  `normalize_final_answer`, `is_equiv`: `simplify(a - b) == 0`), run as installed except for its LaTeX parser.
  It calls `sympy.parsing.latex.parse_latex`, whose default backend needs antlr4 4.11 while math-verify pins
  4.13, so the module refuses to import (an assertion on the antlr4 version); we import it with that check
  answered and hand it sympy's second LaTeX parser, the Lark grammar (`backend="lark"`). Neither our minerva
  verifier (latex2sympy2_extended's ANTLR grammar) nor math-verify uses that parser.
- hendrycks-ref: lm-evaluation-harness 0.4.13's `hendrycks_math/utils.py` `is_equiv`: string normalisation
  (`\\left`, `\\dfrac`, units, `a/b`, ...) and exact string match. No CAS at all.

Inputs: MATH-500 answers (the data root's math500/test.jsonl) rewritten into other forms of the same value and
into wrong values by peer_cases.py (every 6th rewrite, to keep the file to seconds), plus the hand-written pairs.
The measure is balanced agreement: the mean of (share of the peer's correct verdicts we also call correct) and
(share of its incorrect verdicts we also call not correct). A verifier that calls everything correct, or
everything wrong, scores exactly 0.5 on it: the planted verifiers below show the bar catches both.
Every disagreement class is listed in docs/verifiers.md, "Reward hacks (answers)".
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
from importlib import resources

import pytest
from peer_cases import MATH_EQUIVALENT, MATH_HAND_EQUIVALENT, MATH_HAND_WRONG, MATH_WRONG
from verifier_data import read_jsonl

from rlvr_core.verifiers import get_verifier

LM_EVAL_MISSING = "lm-eval is not installed: pip install -c requirements.lock -c requirements-bench.lock -e '.[bench]'"
pytestmark = pytest.mark.shared_data  # MATH-500 from the data root; skipped where it is absent (tests/conftest.py)

EVERY = 6  # every 6th rewrite of the data: ~450 pairs with the hand-written ones, seconds per verifier
BAR = 0.9  # balanced agreement a verifier must reach; always-correct and always-wrong score 0.5


def rewritten_pairs() -> list[tuple[str, str, str, str]]:
    """(intended, rewrite, answer as the response writes it, gold): MATH-500 answers rewritten, then the
    hand-written pairs. `intended` says how the answer was built; the verdicts come from the peers."""
    answers = [r["answer"] for r in read_jsonl("math500/test.jsonl")]
    pairs = []
    for a in answers:
        for intended, rewrites in (("equivalent", MATH_EQUIVALENT), ("wrong", MATH_WRONG)):
            for rewrite in rewrites:
                x = rewrite(a)
                if x is not None and x.strip() != a.strip():
                    pairs.append((intended, rewrite.__name__, x, a))
    pairs = pairs[::EVERY]
    pairs += [("equivalent", "hand", x, g) for x, g in MATH_HAND_EQUIVALENT]
    pairs += [("wrong", "hand", x, g) for x, g in MATH_HAND_WRONG]
    return pairs


def _load_peer_module(name: str, relpath: str, antlr_check: bool = False):
    """Import one of lm-eval's task utils from its installed file (the tasks package has no importable
    path for them). `antlr_check`: answer the module's antlr4-4.11 import check (see the docstring)."""
    pytest.importorskip("lm_eval", reason=LM_EVAL_MISSING)
    # latex2sympy2_extended picks its generated ANTLR parser by the same version check when first imported:
    # import it (and math-verify, which the module imports) under the real version before answering the check.
    import latex2sympy2_extended.antlr_parser
    import math_verify  # noqa: F401

    spec = importlib.util.spec_from_file_location(name, resources.files("lm_eval") / relpath)
    module = importlib.util.module_from_spec(spec)
    real_version = importlib.metadata.version
    if antlr_check:
        importlib.metadata.version = lambda dist: "4.11.0" if dist == "antlr4-python3-runtime" else real_version(dist)
    try:
        spec.loader.exec_module(module)
    finally:
        importlib.metadata.version = real_version
    assert ".antlr4_13_2." in latex2sympy2_extended.antlr_parser.PSParser.__module__
    return module


@pytest.fixture(scope="module")
def minerva_ref():
    pytest.importorskip("lark", reason="lark (sympy's Lark LaTeX parser) is not installed")
    import sympy.parsing.latex

    module = _load_peer_module("lm_eval_minerva_utils", "tasks/minerva_math/utils.py", antlr_check=True)
    module.parse_latex = functools.partial(sympy.parsing.latex.parse_latex, backend="lark")
    assert module.is_equiv("\\frac{1}{2}", "0.5") and not module.is_equiv("\\frac{1}{3}", "0.5")
    return module


@pytest.fixture(scope="module")
def hendrycks_ref():
    module = _load_peer_module("lm_eval_hendrycks_utils", "tasks/hendrycks_math/utils.py")
    assert module.is_equiv("\\dfrac{1}{2}", "\\frac12") and not module.is_equiv("1", "2")
    return module


@pytest.fixture(scope="module")
def pairs():
    return rewritten_pairs()


def minerva_response(x: str) -> str:
    return f"We work it out.\nFinal Answer: The final answer is ${x}$. I hope it is correct."


def balanced_agreement(ours: list[bool], theirs: list[bool]) -> float:
    """Mean of the agreement on the peer's positives and on its negatives (0.5 for a constant verdict)."""
    pos = [o for o, t in zip(ours, theirs) if t]
    neg = [not o for o, t in zip(ours, theirs) if not t]
    assert pos and neg, "the peer must say both correct and incorrect for the measure to mean anything"
    return (sum(pos) / len(pos) + sum(neg) / len(neg)) / 2


def disagreements(pairs, ours, theirs) -> list[tuple[str, str, str, bool, bool]]:
    """(rewrite, answer, gold, ours, peer) where the verdicts differ."""
    return [(p[1], p[2], p[3], o, t) for p, o, t in zip(pairs, ours, theirs) if o != t]


def check(name: str, pairs, ours: list[bool], theirs: list[bool]) -> float:
    agreement = balanced_agreement(ours, theirs)
    planted = {"always correct": [True] * len(ours), "always wrong": [False] * len(ours)}
    print(f"\n{name}: {len(pairs)} pairs, peer correct {sum(theirs)}, balanced agreement {agreement:.4f}, "
          f"plain agreement {sum(o == t for o, t in zip(ours, theirs)) / len(ours):.4f}")
    for rewrite, x, gold, o, t in disagreements(pairs, ours, theirs):
        print(f"  {rewrite:18s} ours={o!s:5s} peer={t!s:5s} answer {x!r} gold {gold!r}")
    for label, verdicts in planted.items():
        assert balanced_agreement(verdicts, theirs) < BAR, label  # the bar catches a constant verifier
    return agreement


def test_minerva_agrees_with_lm_eval_minerva_is_equiv(pairs, minerva_ref):
    ours_v = get_verifier("minerva")
    ref = minerva_ref
    ours, theirs = [], []
    for _, _, x, gold in pairs:
        response = minerva_response(x)
        ours.append(ours_v.verify(response, gold).correct)
        answer = ref.normalize_final_answer(ref.get_unnormalized_answer(response))
        theirs.append(bool(ref.is_equiv(answer, ref.normalize_final_answer(gold))))
    assert check("minerva vs lm-eval minerva (lark parser)", pairs, ours, theirs) >= BAR


def test_math_agrees_with_lm_eval_graders_that_are_not_math_verify(pairs, minerva_ref, hendrycks_ref):
    # The peer's verdict: correct if either lm-eval grader says so (string match after normalisation, or
    # simplify(a - b) == 0). Both are strict, so their union is still a high-precision judge of "equal".
    math_v = get_verifier("math")
    ours, theirs = [], []
    for _, _, x, gold in pairs:
        ours.append(math_v.verify(f"The answer is $\\boxed{{{x}}}$.", gold).correct)
        norm = minerva_ref.normalize_final_answer
        theirs.append(bool(hendrycks_ref.is_equiv(x, gold)) or bool(minerva_ref.is_equiv(norm(x), norm(gold))))
    assert check("math vs lm-eval hendrycks + minerva", pairs, ours, theirs) >= BAR
