"""A run's record in the artifact store: the files every run writes, in one documented layout.

    <experiment>/<run_id>/
      config.yaml        the resolved config (every default filled in)
      manifest.json      code version, config hash, data and model hashes, seeds, package versions
      run.json           the warehouse `runs` row
      params.json        the flattened resolved config (the warehouse `run_params` rows)
      summary.json       the numbers the CLI prints
      passk/pass_rate_table.parquet, passk_curves.parquet, evals/samples.parquet, evals/metrics.parquet

The warehouse is derived from these files (`rlvr warehouse rebuild`), never the other way round.

`write_run_folder` is the one writer of these files, for every flow, and it redacts what it writes
(`tracking.redact`: values under secret-looking keys, passwords inside URLs), so no caller can record a
credential by forgetting to: a tracking URI `http://user:secret@host` is recorded as `http://user:***@host`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

import yaml

from rlvr_core.artifacts.storage import ArtifactStore, join
from rlvr_core.records.tracking import redact


def write_run_folder(local: Path, *, run: dict[str, Any], params: dict[str, Any], manifest: dict[str, Any],
                     config_yaml: str, summary: dict[str, Any], tables: dict[str, pa.Table]) -> Path:
    """Write the run's files (see the module docstring) into `local`, every one of them redacted."""
    local.mkdir(parents=True, exist_ok=True)
    run, params, manifest, summary = redact(run), redact(params), redact(manifest), redact(summary)
    config_yaml = yaml.safe_dump(redact(yaml.safe_load(config_yaml)), sort_keys=False)
    (local / "config.yaml").write_text(config_yaml)
    (local / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str))
    (local / "run.json").write_text(json.dumps(run, indent=2, default=str))
    (local / "params.json").write_text(json.dumps(params, indent=2, sort_keys=True, default=str))
    (local / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    for rel, table in tables.items():
        dest = local / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, dest)
    return local


def upload_run_folder(store: ArtifactStore, prefix: str, local: Path) -> list[str]:
    """Upload everything, run.json last: a reader that sees run.json sees a complete run."""
    files = sorted(p for p in local.rglob("*") if p.is_file())
    keys = [store.put_file(join(prefix, f.relative_to(local).as_posix()), f) for f in files if f.name != "run.json"]
    keys.append(store.put_file(join(prefix, "run.json"), local / "run.json"))
    return keys
