"""`rlvr pull`: fetch models and benchmark data from the Hugging Face hub into its cache, ahead of time.

For clusters whose GPU nodes have no network: run `rlvr pull …` where there is network, with the same
`HF_HOME` (a shared file system, or copy the cache folder over), then run with `HF_HUB_OFFLINE=1`. Each
command prints what it fetched, where, the commit and the hashes; a benchmark's rows are checked against the
hash its file records. The cache is asked first, so a branch is resolved to its commit once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from rlvr_cli.common import fail as _fail
from rlvr_core.core import hub
from rlvr_core.core.manifest import rows_sha256
from rlvr_core.data.loaders import DataFormatError
from rlvr_core.experiment.benchmarks import BenchmarkSpec, hub_rows, hub_splits, load_benchmark, resolve_suite
from rlvr_core.experiment.config import ConfigError, load_config

pull_app = typer.Typer(no_args_is_help=True, help="Fetch models and benchmark data into the Hugging Face cache "
                       "(for machines without network: then run with HF_HUB_OFFLINE=1).")


def _pull_model(ref: str) -> None:
    repo, revision = hub.split_ref(ref)
    try:
        snap = hub.snapshot(repo, revision=revision, pulling=True)
    except hub.HubMissing as e:
        _fail(str(e))
    typer.echo(f"model {repo} (asked: {revision or 'default branch'}) -> commit {snap.commit}")
    typer.echo(f"  in {snap.folder}")
    for name, sha in snap.files.items():
        typer.echo(f"  {sha}  {name}")
    if revision != snap.commit:
        typer.echo(f"  pin it: model.path: {repo} with model.revision: {snap.commit}  (or {repo}@{snap.commit})")


def _pull_benchmark(spec: BenchmarkSpec) -> None:
    splits = hub_splits(spec)
    if not splits:
        typer.echo(f"benchmark {spec.name}: no hub copy to fetch ({spec.data.source} data: generated, packaged "
                   "or read from the data root only)")
        return
    h = spec.data.hub
    for split in splits:
        try:
            snap, rows = hub_rows(spec, split, pulling=True)
        except (hub.HubMissing, DataFormatError) as e:
            _fail(str(e))
        check = "matches the benchmark file" if spec.data.rows_sha256.get(split) else "no hash in the benchmark file"
        typer.echo(f"benchmark {spec.name} [{split}]: {h.repo} commit {snap.commit}, {len(rows)} rows, rows sha256 "
                   f"{rows_sha256(rows)} ({check})")
        typer.echo(f"  in {snap.folder}")
        for name, sha in snap.files.items():
            typer.echo(f"  {sha}  {name}")
        if h.revision is None:
            typer.echo(f"  pin it: data.hub.revision: {snap.commit}  (configs/benchmarks/{spec.name}.yaml)")


@pull_app.command("model")
def pull_model(ref: str = typer.Argument(..., help="hub id, org/name[@revision], e.g. Qwen/Qwen2.5-0.5B")) -> None:
    """Fetch a model snapshot (all its files) and print its commit and file hashes."""
    if not hub.is_hub_id(ref):
        _fail(f"{ref}: not a hub id (org/name[@revision]), or a local path that exists")
    _pull_model(ref)


@pull_app.command("benchmark")
def pull_benchmark(
    name: list[str] = typer.Argument(None, help="benchmark names or YAML files"),
    suite: Optional[str] = typer.Option(None, "--suite", "-s", help="every benchmark of this suite"),
) -> None:
    """Fetch the hub copy of benchmarks' data (every split they read) and check it against their row hashes."""
    if bool(name) == bool(suite):
        _fail("give benchmark NAMEs or --suite NAME, not both and not neither")
    try:
        specs = resolve_suite(suite, check_data=False) if suite else [load_benchmark(n, check_data=False) for n in name]
    except ConfigError as e:
        _fail(str(e))
    for spec in specs:
        _pull_benchmark(spec)


@pull_app.command("config")
def pull_config(file: Path = typer.Argument(..., help="experiment YAML")) -> None:
    """Fetch everything an experiment config reads from the hub: its model and its data.benchmark's data."""
    try:
        cfg = load_config(file)
        spec = load_benchmark(cfg.data.benchmark, check_data=False) if cfg.data.benchmark else None
    except ConfigError as e:
        _fail(str(e))
    ref = cfg.model.hub_ref()
    if ref is None and spec is None:
        typer.echo(f"{file}: nothing to fetch (local model and data)")
    if ref is not None:
        _pull_model(ref[0] + (f"@{ref[1]}" if ref[1] else ""))
    if spec is not None:
        _pull_benchmark(spec)
