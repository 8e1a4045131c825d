"""What the data and base-model stages hand on: the artifacts every later stage reads, the same artifact with its
paths on this worker (`here`), and the run manifest built from them (`experiment_manifest`). Each other stage's
output sits next to its stage (`rlvr_core.pipeline.*_stage`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from rlvr_core.core import manifest as manifest_mod
from rlvr_core.core.numerics import numerics
from rlvr_core.data.jsonl import read_jsonl
from rlvr_core.experiment.config import ExperimentConfig
from rlvr_core.pipeline.cache import localize


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


_PATH_FIELDS = frozenset({"path", "train_path", "test_path", "table_path", "samples_path", "steps_path", "folder"})


def here(artifact):
    """The artifact with every path it names on this worker: a path in another worker's stage cache becomes the
    same folder in this one, fetched from the stage store (`rlvr_core.pipeline.cache.localize`)."""
    changes = {}
    for f in dataclasses.fields(artifact):
        value = getattr(artifact, f.name)
        if f.name in _PATH_FIELDS and isinstance(value, str):
            changes[f.name] = localize(value)
        elif dataclasses.is_dataclass(value):
            changes[f.name] = here(value)
    return dataclasses.replace(artifact, **changes) if changes else artifact


def experiment_manifest(cfg: ExperimentConfig, data: DataArtifact, model: ModelArtifact, *, config_hash: str,
                        resolved_config: dict[str, Any], template_key: str, extra: dict[str, Any]) -> dict[str, Any]:
    """The run manifest of one experiment (demo or pipeline): config, data hashes, every seed, the base model
    and the template, plus `extra` (run ids, artifact ids)."""
    return manifest_mod.build_manifest(
        config_hash=config_hash, resolved_config=resolved_config,
        datasets={"train": data.train_hash, "test": data.test_hash},
        seeds={"experiment": cfg.seed, "sampling": cfg.sampling.seed, "data": cfg.data.synthetic.seed,
               "warm_start": cfg.model.warm_start.seed, "curriculum": cfg.curriculum.seed},
        model={"id": model.model_id, "hash": model.model_hash, "tokenizer_hash": model.tokenizer_hash,
               "path": model.path, "source": cfg.model.source, "kind": cfg.model.kind, "dtype": cfg.model.dtype,
               "hub": model.info.get("hub")},
        template=template_key, extra={"numerics": numerics(), **extra})
