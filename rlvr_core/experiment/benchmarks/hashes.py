"""What identifies a benchmark's numbers: the resolved spec and its hash (the settings), and the hash of the
problems and shots it evaluates on (the data)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlvr_core.core.manifest import rows_sha256
from rlvr_core.data.templates import get_template
from rlvr_core.experiment.benchmarks.data import few_shot_examples, load_benchmark_problems
from rlvr_core.experiment.benchmarks.prompts import effective_stop
from rlvr_core.experiment.benchmarks.scoring import build_verifier, scoring_label, scorings
from rlvr_core.experiment.benchmarks.spec import BenchmarkSpec
from rlvr_core.experiment.config import config_hash


def resolved_benchmark(spec: BenchmarkSpec) -> dict[str, Any]:
    """What is stored with results and hashed: the spec without its description, stop sequences resolved,
    plus the template's key (id@version) and each scoring's verifier version. `data.hub` is left out: where
    the rows are read from changes no number (their content is `benchmark_data_hash`, and `data.rows_sha256`
    makes a different copy fail), so moving a set from a folder to the hub keeps the hash."""
    out = spec.model_dump(mode="json", exclude={"description": True, "data": {"hub", "rows_sha256"}})
    out["generation"]["stop"] = effective_stop(spec)
    out["resolved"] = {
        "template": get_template(spec.prompt.template).key,
        "verifiers": {scoring_label(v): getattr(build_verifier(v), "version", None) for v in scorings(spec)},
    }
    return out


def benchmark_hash(spec: BenchmarkSpec) -> str:
    """sha256 of the canonical JSON of `resolved_benchmark(spec)`: stable across key order and machines."""
    return config_hash(resolved_benchmark(spec))


def benchmark_data_hash(spec: BenchmarkSpec, root: str | Path | None = None,
                        problems: list[dict] | None = None) -> str:
    """Content hash of what the spec evaluates on: the problems (subset applied) and the few-shot examples.

    `benchmark_hash` covers the settings, not the bytes of the data file; store this one next to it so a
    changed data file is caught too. Pass `problems` when they are already loaded.
    """
    rows = load_benchmark_problems(spec, root) if problems is None else problems
    shots = [{"question": q, "completion": a} for q, a in few_shot_examples(spec, root)]
    return config_hash({"problems": rows_sha256(rows), "shots": rows_sha256(shots)})
