"""A small warehouse built from the sample run folders (sample_runs.py), once per session."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import sample_runs

from rlvr_core.artifacts.storage import LocalStore
from rlvr_core.records import warehouse


@dataclass
class SampleWarehouse:
    db: Path
    runs: sample_runs.SampleRuns


@pytest.fixture(scope="session")
def sample_warehouse(tmp_path_factory) -> SampleWarehouse:
    root = tmp_path_factory.mktemp("sample-warehouse")
    runs = sample_runs.build(LocalStore(root / "store"), root / "local")
    db = root / "warehouse.duckdb"
    warehouse.ingest_all(runs.store, db)
    return SampleWarehouse(db, runs)
