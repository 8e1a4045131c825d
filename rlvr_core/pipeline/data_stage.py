"""The data stage: the experiment's train and test problems (synthetic, a benchmark's splits, or files read through
the loaders), written as two JSONL files in the stage cache and keyed by their contents."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from rlvr_core.core.manifest import file_sha256, rows_sha256
from rlvr_core.core.progress import SILENT, Progress
from rlvr_core.data.jsonl import read_jsonl, write_jsonl
from rlvr_core.data.loaders import load_problems
from rlvr_core.data.synthetic import ProductsSpec, SyntheticSpec, make_products_dataset, make_synthetic_dataset
from rlvr_core.experiment.benchmarks import load_benchmark, split_problems
from rlvr_core.experiment.config import ExperimentConfig
from rlvr_core.pipeline.cache import cached_dir
from rlvr_core.pipeline.stage_outputs import DataArtifact

# Bump when the stage's code changes what it produces, so stale cache entries are not reused.
DATA_STAGE_VERSION = "1"


def _synthetic_data(syn: Any) -> tuple[Path, bool]:
    """The synthetic splits, cached: word problems (the demo's; key as it always was) or products (the tool demo)."""
    if syn.task == "products":
        spec: Any = ProductsSpec(n_train=syn.n_train, n_test=syn.n_test, seed=syn.seed, digits=tuple(syn.digits))
        make, name = make_products_dataset, "products"
    else:
        spec = SyntheticSpec(n_train=syn.n_train, n_test=syn.n_test, seed=syn.seed, difficulty=syn.difficulty)
        make, name = make_synthetic_dataset, "synthetic"

    def build(tmp: Path) -> None:
        splits = make(spec)
        write_jsonl(splits["train"], tmp / "train.jsonl")
        write_jsonl(splits["test"], tmp / "test.jsonl")

    return cached_dir("data", {"stage": DATA_STAGE_VERSION, name: asdict(spec)}, build)


def prepare_data(cfg: ExperimentConfig, progress: Progress = SILENT) -> DataArtifact:
    """Generate (synthetic) or read the train/test problems; returns paths and content hashes."""
    d = cfg.data
    if d.source == "synthetic":
        folder, hit = _synthetic_data(d.synthetic)
        train_path, test_path = folder / "train.jsonl", folder / "test.jsonl"
    elif d.benchmark is not None:
        folder, hit = _benchmark_data(d.benchmark)
        train_path, test_path = folder / "train.jsonl", folder / "test.jsonl"
    else:
        train_path = Path(d.train_path)
        test_path = Path(d.test_path)
        # Real sets are read (and schema-checked) through the loaders; the cache holds the mapped rows.
        def build(tmp: Path) -> None:
            write_jsonl(load_problems(d.source, train_path), tmp / "train.jsonl")
            write_jsonl(load_problems(d.source, test_path), tmp / "test.jsonl")

        key = {"stage": DATA_STAGE_VERSION, "source": d.source,
               "train": file_sha256(train_path), "test": file_sha256(test_path)}
        folder, hit = cached_dir("data", key, build)
        train_path, test_path = folder / "train.jsonl", folder / "test.jsonl"
    train, test = read_jsonl(train_path), read_jsonl(test_path)
    progress("data", f"{len(train)} train / {len(test)} test problems ({'cached' if hit else 'built'})")
    return DataArtifact(str(train_path), str(test_path), rows_sha256(train), rows_sha256(test),
                        len(train), len(test), hit)


def _benchmark_data(name: str) -> tuple[Path, bool]:
    """`data.benchmark`: the benchmark's train split and evaluated split (data root, else hub; hash-checked),
    cached as the data stage's two files, keyed by their contents."""
    spec = load_benchmark(name, check_data=False)
    train, test = split_problems(spec, "train"), split_problems(spec, spec.data.split)

    def build(tmp: Path) -> None:
        write_jsonl(train, tmp / "train.jsonl")
        write_jsonl(test, tmp / "test.jsonl")

    key = {"stage": DATA_STAGE_VERSION, "source": spec.data.source, "benchmark": name,
           "train": rows_sha256(train), "test": rows_sha256(test)}
    return cached_dir("data", key, build)
