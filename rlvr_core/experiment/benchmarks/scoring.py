"""How a benchmark scores a completion: its scorings (headline verifier, then side-by-side), the verifier
objects, each problem's gold (rlvr_core/data/gold.py decides it) and whether a problem has what they need."""

from __future__ import annotations

import functools
import json
from typing import Any

from rlvr_core.data.gold import gold_of
from rlvr_core.experiment.benchmarks.spec import BenchmarkSpec, VerifierSpec
from rlvr_core.verifiers import get_verifier

# Verifiers whose gold is the problem's `answer` string and whose `extracted` answers can be voted on (maj@k).
ANSWER_VERIFIERS = ("gsm8k", "math", "minerva", "mcq")


def scoring_label(v: VerifierSpec) -> str:
    """'gsm8k:strict', 'minerva', 'mcq' — how a scoring is named in results."""
    return f"{v.name}:{v.mode}" if v.mode else v.name


def scorings(spec: BenchmarkSpec) -> list[VerifierSpec]:
    """The headline verifier first, then the side-by-side ones."""
    return [spec.verifier, *spec.side_by_side]


@functools.lru_cache(maxsize=64)
def built_verifier(name: str, options_json: str):
    return get_verifier(name, **json.loads(options_json))


def build_verifier(v: VerifierSpec):
    """The verifier object (built once per process per settings)."""
    opts = dict(v.options) | ({"mode": v.mode} if v.mode is not None else {})
    return built_verifier(v.name, json.dumps(opts, sort_keys=True, default=str))


def gold_for(spec: BenchmarkSpec, problem: dict) -> Any:
    """What the benchmark's verifiers get as gold for one problem (same for headline and side-by-side;
    rlvr_core/data/gold.py decides it)."""
    return gold_of(problem, spec.verifier.name)


def problem_issue(spec: BenchmarkSpec, problem: dict) -> str | None:
    """Why `problem` lacks what the benchmark's verifiers need (None when it has it)."""
    if not isinstance(problem.get("question"), str) or not problem["question"].strip():
        return "empty question"
    meta = problem.get("meta") or {}
    for v in scorings(spec):
        if v.name == "ifeval":
            ids, kw = meta.get("instruction_id_list"), meta.get("kwargs")
            if not isinstance(ids, list) or not isinstance(kw, list) or not ids or len(ids) != len(kw):
                return "ifeval needs meta.instruction_id_list and meta.kwargs (lists of the same length)"
        elif v.name == "code":
            if not meta.get("tests"):
                return "code needs meta.tests"
        else:
            ans = problem.get("answer")
            if not isinstance(ans, str) or not ans.strip():
                return f"{v.name} needs a non-empty answer"
            if v.name == "mcq":
                letters = v.options.get("letters", "ABCDE")
                if len(ans.strip()) != 1 or ans.strip() not in letters:
                    return f"mcq gold {ans!r} is not one of the letters {letters}"
    for f in spec.breakdown:
        if f not in meta:
            return f"no meta field {f!r} for the breakdown"
    return None
