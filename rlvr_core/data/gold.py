"""The one place a row's gold answer is decided: what a verifier checks a completion against.

Two shapes of row reach a verifier:
  * a problem: the loaders' schema {id, question, answer, solution, meta} (benchmarks, loaded sets) or a
    synthetic row, whose `answer` is the worked solution and `final_answer` the bare number. The trainer, the
    pass-rate and evaluation stages, the benchmarks (`gold_for`) and the probes take its gold with `gold_of`;
  * a line of `rlvr verify`'s input JSONL, which carries the same fields at its top level (IFEval's
    input_data.jsonl layout): `line_gold`.
Most verifiers check an answer string; `ifeval` gets the instructions and their arguments (plus the prompt,
which some instructions quote), `code` the test code. Data sits below the verifiers in the layers, so the
verifiers are named here, not imported.
"""

from __future__ import annotations

from typing import Any, Mapping

__all__ = ["gold_of", "line_gold", "IFEVAL_FIELDS"]

IFEVAL_FIELDS = ("instruction_id_list", "kwargs")


def _ifeval_gold(fields: Mapping[str, Any], prompt: str) -> dict[str, Any]:
    return {k: fields[k] for k in IFEVAL_FIELDS} | {"prompt": prompt}


def gold_of(row: Mapping[str, Any], verifier: str | None = None) -> Any:
    """The gold of a problem row for `verifier` (None: an answer-checking one): `ifeval` and `code` read the
    row's `meta` (with the question as ifeval's prompt); the others `final_answer` when the row has one
    (synthetic rows), else `answer`. KeyError when a field is missing."""
    if verifier == "ifeval":
        return _ifeval_gold(row["meta"], row["question"])
    if verifier == "code":
        return row["meta"]["tests"]
    return row["final_answer"] if "final_answer" in row else row["answer"]


def line_gold(verifier: str, row: Mapping[str, Any]) -> Any:
    """The gold of one line of `rlvr verify`'s input for `verifier`: `ifeval` reads instruction_id_list and
    kwargs (and an optional prompt), `code` reads tests, the others answer, all at the line's top level.
    KeyError naming the missing field."""
    if verifier == "ifeval":
        return _ifeval_gold(row, row.get("prompt", ""))
    if verifier == "code":
        return row["tests"]
    return row["answer"]
