"""What the data and base-model stages hand on: the artifacts every later stage reads (the rest of the
stages' outputs sit next to their stage in `rlvr_core.pipeline.stages`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlvr_core.data.jsonl import read_jsonl


@dataclass(frozen=True)
class DataArtifact:
    train_path: str
    test_path: str
    train_hash: str
    test_hash: str
    n_train: int
    n_test: int
    cached: bool

    @property
    def dataset_hash(self) -> str:
        return f"{self.train_hash[:16]}-{self.test_hash[:16]}"

    def train_rows(self) -> list[dict]:
        return read_jsonl(self.train_path)

    def test_rows(self) -> list[dict]:
        return read_jsonl(self.test_path)


@dataclass(frozen=True)
class ModelArtifact:
    path: str
    model_id: str
    model_hash: str
    tokenizer_hash: str
    cached: bool
    info: dict[str, Any] = field(default_factory=dict)
