"""Where a benchmark's rows come from: the data root, the files of each split, the synthetic task, the hub copy
(cache first), the rows-hash check, the evaluated problems (subset applied, checked for the verifiers) and the
few-shot examples."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

from rlvr_core.core import hub
from rlvr_core.core.manifest import rows_sha256
from rlvr_core.data.loaders import DEFAULT_FILES, DataFormatError, load_problem_files, load_problems, packaged_file
from rlvr_core.data.synthetic import ProductsSpec, SyntheticSpec, make_products_dataset, make_synthetic_dataset
from rlvr_core.experiment.benchmarks.scoring import problem_issue
from rlvr_core.experiment.benchmarks.spec import DATA_DIR_ENV, PROJECT_ROOT, SYNTHETIC, BenchmarkSpec
from rlvr_core.experiment.config import SyntheticDataConfig


def data_root() -> Path:
    """$RLVR_DATA_DIR if set, else ../shared/data next to the project (the public sets the tests use)."""
    env = os.environ.get(DATA_DIR_ENV)
    return Path(env) if env else (PROJECT_ROOT.parent / "shared" / "data")


def resolve_path(source: str, split: str, path: str | None, root: Path) -> Path:
    if path is None and split == "test" and packaged_file(source) is not None:
        return packaged_file(source)  # shipped in an installed package (humaneval), no data-root file
    if path is None:
        name = DEFAULT_FILES[source] if split == "test" else f"{split}.jsonl"
        return root / source / name
    p = Path(path)
    p = p if p.is_absolute() else root / p
    if p.is_dir():
        p = p / (DEFAULT_FILES[source] if split == "test" else f"{split}.jsonl")
    return p


def data_file(spec: BenchmarkSpec, root: str | Path | None = None) -> Path | None:
    """The file the benchmark's problems are read from (None for the synthetic task)."""
    if spec.data.source == SYNTHETIC:
        return None
    return resolve_path(spec.data.source, spec.data.split, spec.data.path, Path(root) if root else data_root())


def few_shot_file(spec: BenchmarkSpec, root: Path) -> Path | None:
    fs = spec.prompt.few_shot
    if fs.source != "split" or spec.data.source == SYNTHETIC:
        return None
    return resolve_path(spec.data.source, fs.split or "", fs.path, root)


def _synthetic_rows(spec: BenchmarkSpec, split: str) -> list[dict]:
    s = spec.data.synthetic or SyntheticDataConfig()
    # The test split does not depend on n_train (synthetic.py), so it is generated without the train split.
    if s.task == "products":  # the tool demo's (its test split too does not depend on n_train)
        rows = make_products_dataset(ProductsSpec(n_train=s.n_train if split == "train" else 0, n_test=s.n_test,
                                                  seed=s.seed, digits=tuple(s.digits)))[split]
    else:
        gen = SyntheticSpec(n_train=s.n_train if split == "train" else 0, n_test=s.n_test, seed=s.seed,
                            difficulty=s.difficulty)
        rows = make_synthetic_dataset(gen)[split]
    # The loaders' schema; ids stay the generator's (synth-test-000017), as in the demo's evaluate stage.
    return [{"id": r["id"], "question": r["question"], "answer": r["final_answer"], "solution": r["answer"],
             "meta": {"difficulty": r["difficulty"], "n_steps": r["n_steps"]}} for r in rows]


def hub_split(spec: BenchmarkSpec, split: str, pulling: bool = False) -> hub.Snapshot:
    """The hub snapshot holding `split` of the benchmark's data (cache first, then a download unless offline);
    HubMissing names `rlvr pull benchmark <name>` when neither works."""
    h = spec.data.hub
    if h is None or split not in h.files:
        raise KeyError(f"benchmark {spec.name} names no hub file for split {split!r}")
    return hub.snapshot(h.repo, repo_type="dataset", revision=h.revision, allow_patterns=[h.files[split]],
                        pull=f"rlvr pull benchmark {spec.name}", pulling=pulling)


def uses_hub(spec: BenchmarkSpec, split: str, file: Path | None) -> bool:
    """The data root first (air-gapped clusters): the hub only when its file is missing and the hub has the split."""
    h = spec.data.hub
    return file is not None and not file.is_file() and h is not None and split in h.files


def read_split(spec: BenchmarkSpec, split: str, file: Path | None) -> list[dict]:
    if spec.data.source == SYNTHETIC:
        return _synthetic_rows(spec, split)
    if uses_hub(spec, split, file):
        return hub_rows(spec, split)[1]
    rows = load_problems(spec.data.source, file, split=split)
    _check_rows_hash(spec, split, rows, str(file))
    return rows


def hub_rows(spec: BenchmarkSpec, split: str, pulling: bool = False) -> tuple[hub.Snapshot, list[dict]]:
    """One split read from the benchmark's hub copy (whatever the data root holds), hash-checked."""
    snap = hub_split(spec, split, pulling)
    files = sorted(snap.folder / f for f in snap.files)
    where = f"hf://datasets/{snap.repo}@{snap.commit}/{spec.data.hub.files[split]}"
    if not files:
        raise DataFormatError(f"{where}: no file matches")
    rows = load_problem_files(spec.data.source, files, split=split, where=where)
    _check_rows_hash(spec, split, rows, where)
    return snap, rows


def hub_splits(spec: BenchmarkSpec) -> list[str]:
    """The splits a benchmark reads that its hub copy provides: the evaluated one, the shots' one, and `train`
    (what an experiment with `data.benchmark` trains on) when listed."""
    h, fs = spec.data.hub, spec.prompt.few_shot
    if h is None:
        return []
    wanted = [spec.data.split] + ([fs.split] if fs.source == "split" and fs.split else []) + ["train"]
    return [s for s in dict.fromkeys(wanted) if s in h.files]


def split_problems(spec: BenchmarkSpec, split: str, root: str | Path | None = None) -> list[dict]:
    """All rows of one split of the benchmark's data set in the loaders' schema (no subset, no checks for the
    verifiers): the data root's file, else the hub copy, hash-checked. What an experiment trains on
    (`data.benchmark`)."""
    path = spec.data.path if split == spec.data.split else None
    root = Path(root) if root else data_root()
    return read_split(spec, split, None if spec.data.source == SYNTHETIC else
                 resolve_path(spec.data.source, split, path, root))


def data_source_record(spec: BenchmarkSpec, root: str | Path | None = None) -> dict[str, Any]:
    """Where the evaluated split is read from, for the result: the local file, or the hub snapshot (repo,
    requested revision, commit, file hashes)."""
    if spec.data.source == SYNTHETIC:
        return {"kind": "synthetic"}
    file = data_file(spec, root)
    if uses_hub(spec, spec.data.split, file):
        return {"kind": "hub", **hub_split(spec, spec.data.split).record()}
    return {"kind": "file", "path": str(file)}


def _check_rows_hash(spec: BenchmarkSpec, split: str, rows: list[dict], where: str) -> None:
    """The rows must be the ones the benchmark file was written for: a changed upstream set or an edited local
    copy would otherwise change the numbers silently."""
    want = spec.data.rows_sha256.get(split)
    if want is None:
        return
    got = rows_sha256(rows)
    if got != want:
        raise DataFormatError(f"{where}: the {split} rows hash to {got[:16]}…, but benchmark {spec.name} "
                              f"(data.rows_sha256.{split}) expects {want[:16]}…: the data differs from the set "
                              "the benchmark was written for (another upstream revision or an edited file)")


def load_benchmark_problems(spec: BenchmarkSpec, root: str | Path | None = None) -> list[dict]:
    """The benchmark's problems in the loaders' schema ({id, question, answer, solution, meta}), subset applied.

    Every problem is checked for what the verifiers need; a problem without it raises DataFormatError naming
    the file and the problem id (before any sampling).
    """
    d = spec.data
    file = data_file(spec, root)
    problems = read_split(spec, d.split, file)
    if d.max_problems is not None and d.max_problems < len(problems):
        if d.subset_seed is None:
            problems = problems[: d.max_problems]
        else:
            keep = sorted(random.Random(d.subset_seed).sample(range(len(problems)), d.max_problems))
            problems = [problems[i] for i in keep]
    where = str(file) if file else f"synthetic/{d.split}"
    for p in problems:
        why = problem_issue(spec, p)
        if why:
            raise DataFormatError(f"{where}: problem {p['id']!r}: {why} (benchmark {spec.name})")
    return problems


def few_shot_examples(spec: BenchmarkSpec, root: str | Path | None = None) -> list[tuple[str, str]]:
    """(question, completion) pairs of the benchmark's worked examples (empty for none/template shots)."""
    fs = spec.prompt.few_shot
    if fs.source == "inline":
        return [(e.question, e.completion) for e in fs.examples]
    if fs.source != "split":
        return []
    rows = read_split(spec, fs.split or "", few_shot_file(spec, Path(root) if root else data_root()))
    if len(rows) < fs.num_shots:
        raise ValueError(f"split {fs.split!r} has {len(rows)} rows, fewer than num_shots={fs.num_shots}")
    if fs.select == "first":
        picked = rows[: fs.num_shots]
    else:
        picked = [rows[i] for i in random.Random(fs.seed).sample(range(len(rows)), fs.num_shots)]
    missing = [r["id"] for r in picked if not r.get("solution")]
    if missing:
        raise ValueError(f"split {fs.split!r} rows have no worked solution to use as a shot: {missing}")
    return [(r["question"], r["solution"]) for r in picked]
