"""Shared helpers for verifier tests: the real public data sets under the data root ($RLVR_DATA_DIR, else
../shared/data; never copied here). Tests that need them skip, naming the path, where they are absent."""

import json

import pytest

from rlvr_core.experiment.benchmarks import data_root

DATA = data_root()


def read_jsonl(rel: str) -> list[dict]:
    path = DATA / rel
    if not path.exists():
        pytest.skip(f"shared data not found at {path}")
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]
