"""Benchmarks and suites by name or path: read the YAML, validate it (schema, then checks.py), and an
experiment's `data.benchmark` checked before any work."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rlvr_core.core import hub
from rlvr_core.experiment.benchmarks.checks import data_file_problems, semantic_problems
from rlvr_core.experiment.benchmarks.data import resolve_path, uses_hub, data_root, hub_split
from rlvr_core.experiment.benchmarks.spec import BENCHMARK_DIR, SUITE_DIR, BenchmarkSpec, SuiteSpec
from rlvr_core.experiment.config import ConfigError, read_yaml_file


def _loc(err: dict[str, Any]) -> str:
    return ".".join(str(p) for p in err["loc"])


def _why(err: dict[str, Any]) -> str:
    if err["type"] == "extra_forbidden":
        return "unknown key"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] != "value_error" and "input" in err and not isinstance(err["input"], (dict, list)):
        msg += f" (got {err['input']!r})"
    return msg


def parse_benchmark(data: Any, source: str = "<benchmark>", *, check_data: bool = True,
                    root: str | Path | None = None) -> BenchmarkSpec:
    """Validate a mapping into a BenchmarkSpec, or raise ConfigError naming `source` and each field.

    check_data: also check that the data files exist (and few-shot rows load) under `root` (default
    `data_root()`); off for specs of data that lives elsewhere (e.g. loaded from the hub by the caller).
    """
    if not isinstance(data, dict):
        raise ConfigError(source, [("", f"top level must be a mapping, got {type(data).__name__}")])
    try:
        spec = BenchmarkSpec.model_validate(data)
    except ValidationError as e:
        raise ConfigError(source, [(_loc(err), _why(err)) for err in e.errors()]) from None
    problems = semantic_problems(spec)
    if not problems and check_data:
        problems = data_file_problems(spec, Path(root) if root else data_root())
        if spec.name not in known_benchmarks():  # not shipped: `rlvr pull benchmark` takes its file
            pull = f"rlvr pull benchmark {spec.name}`"
            problems = [(f, why.replace(pull, f"rlvr pull benchmark {source}`")) for f, why in problems]
    if problems:
        raise ConfigError(source, problems)
    return spec


def _is_path(name_or_path: str | Path) -> bool:
    s = str(name_or_path)
    return isinstance(name_or_path, Path) or "/" in s or os.sep in s or s.endswith((".yaml", ".yml"))


def known_benchmarks() -> list[str]:
    """Names of the benchmark files in configs/benchmarks/."""
    return sorted(p.stem for p in BENCHMARK_DIR.glob("*.yaml"))


def _named_file(name_or_path: str | Path, folder: Path, what: str, known: list[str]) -> Path:
    """A path as given, or `folder/<name>.yaml` for a bare name (an unknown name lists the known ones)."""
    if _is_path(name_or_path):
        return Path(name_or_path)
    path = folder / f"{name_or_path}.yaml"
    if not path.is_file():
        raise ConfigError(str(path), [("", f"no {what} named {str(name_or_path)!r}; known: {', '.join(known)}")])
    return path


def load_benchmark(name_or_path: str | Path, *, check_data: bool = True,
                   root: str | Path | None = None) -> BenchmarkSpec:
    """A benchmark by name (configs/benchmarks/<name>.yaml) or from a YAML file; validated before any work.

    The spec's `name` must equal the file's stem, so a name always means one file.
    """
    path = _named_file(name_or_path, BENCHMARK_DIR, "benchmark", known_benchmarks())
    data = read_yaml_file(path)
    if isinstance(data, dict) and "name" in data and data["name"] != path.stem:
        raise ConfigError(str(path), [("name", f"must equal the file name {path.stem!r} (got {data['name']!r})")])
    return parse_benchmark(data, str(path), check_data=check_data, root=root)


def check_experiment_data(benchmark: str, source: str, where: str) -> None:
    """An experiment's `data.benchmark`: the file exists, is for `source`, and has a train split to give
    (locally or on the hub; offline, in the cache). ConfigError naming `where` otherwise."""
    try:
        spec = load_benchmark(benchmark)
    except ConfigError as e:
        raise ConfigError(where, [("data.benchmark", f"{e.source}: {p}: {why}" if p else f"{e.source}: {why}")
                                  for p, why in e.problems]) from None
    if spec.data.source != source:
        raise ConfigError(where, [("data.benchmark", f"benchmark {benchmark!r} reads {spec.data.source!r} data but "
                                   f"data.source is {source!r}")])
    train = resolve_path(spec.data.source, "train", None, data_root())
    if not train.is_file() and not uses_hub(spec, "train", train):
        raise ConfigError(where, [("data.benchmark", f"no train split: no file {train} and benchmark {benchmark!r} "
                                   "names no hub file for 'train'")])
    if uses_hub(spec, "train", train):
        try:
            hub_split(spec, "train")
        except hub.HubMissing as e:
            raise ConfigError(where, [("data.benchmark", f"no data file {train}, and {e}")]) from None


# ------------------------------------------------------------------------------------------ suites
def known_suites() -> list[str]:
    return sorted(p.stem for p in SUITE_DIR.glob("*.yaml"))


def load_suite(name_or_path: str | Path) -> SuiteSpec:
    """A suite by name (configs/benchmarks/suites/<name>.yaml) or path; every listed benchmark must exist."""
    path = _named_file(name_or_path, SUITE_DIR, "suite", known_suites())
    data = read_yaml_file(path)
    if not isinstance(data, dict):
        raise ConfigError(str(path), [("", f"top level must be a mapping, got {type(data).__name__}")])
    try:
        suite = SuiteSpec.model_validate(data)
    except ValidationError as e:
        raise ConfigError(str(path), [(_loc(err), _why(err)) for err in e.errors()]) from None
    problems = []
    if suite.name != path.stem:
        problems.append(("name", f"must equal the file name {path.stem!r} (got {suite.name!r})"))
    known = known_benchmarks()
    for i, b in enumerate(suite.benchmarks):
        if b not in known:
            problems.append((f"benchmarks.{i}", f"unknown benchmark {b!r}; known: {', '.join(known)}"))
        elif b in suite.benchmarks[:i]:
            problems.append((f"benchmarks.{i}", f"{b!r} listed twice"))
    if problems:
        raise ConfigError(str(path), problems)
    return suite


def resolve_suite(name_or_path: str | Path, *, check_data: bool = True,
                  root: str | Path | None = None) -> list[BenchmarkSpec]:
    """The validated specs of a suite's benchmarks, in the suite's order."""
    return [load_benchmark(b, check_data=check_data, root=root) for b in load_suite(name_or_path).benchmarks]
