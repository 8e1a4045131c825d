"""A run's record in the artifact store: the files every run writes, in one documented layout.

    <experiment>/<run_id>/
      config.yaml        the resolved config (every default filled in)
      manifest.json      code version, config hash, data and model hashes, seeds, package versions
      run.json           the warehouse `runs` row
      params.json        the flattened resolved config (the warehouse `run_params` rows)
      summary.json       the numbers the CLI prints
      passk/pass_rate_table.parquet, passk_curves.parquet, evals/samples.parquet, evals/metrics.parquet

The warehouse is derived from these files (`rlvr warehouse rebuild`), never the other way round.

`record_run` is the one recorder of a finished run, for every flow: it writes these files, uploads them,
logs the same params, metrics and tags to MLflow, writes the folder's index.html and ingests the folder
into the warehouse. Redaction happens inside it (`write_run_folder`, its tables included, and `Tracker.log_params`/`set_tags`:
values under secret-looking keys, passwords inside URLs), so no caller can record a credential by
forgetting to: a tracking URI `http://user:secret@host` is recorded as `http://user:***@host`.
Every step is idempotent (files are overwritten, MLflow params are identical, ingest is delete-then-insert
per run), so a retried recorder never duplicates anything.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import yaml

from rlvr_core.artifacts.artifacts_index import write_run_index
from rlvr_core.artifacts.storage import ArtifactStore, join
from rlvr_core.records import warehouse
from rlvr_core.records.redact import REDACTED, URL_WITH_USERINFO, is_secret_key, redact, redact_text
from rlvr_core.records.tracking import Tracker


def record_run(store: ArtifactStore, prefix: str, tracker: Tracker, run_id: str, *, run: dict[str, Any],
               params: dict[str, Any], manifest: dict[str, Any], config: dict[str, Any], summary: dict[str, Any],
               tables: dict[str, pa.Table], metrics: dict[str, float], tags: dict[str, Any],
               texts: dict[str, str] | None = None, folders: dict[str, Path] | None = None,
               step_rows: list[dict[str, Any]] | None = None) -> dict[str, int]:
    """Record a finished run everywhere: the run folder (module docstring) in the artifact store, the same
    params/metrics/tags and the folder on the MLflow run, the folder's index.html, the warehouse rows.

    `texts`: extra text files (e.g. report.md), redacted like everything else; `folders`: local folders
    copied into the run folder under the given name (e.g. a probe report); `step_rows`: per-step training
    metrics, of which MLflow gets only the ones it does not have yet. Returns the warehouse rows per table."""
    with tempfile.TemporaryDirectory(prefix="rlvr-run-") as tmp:
        local = write_run_folder(Path(tmp), run=run, params=params, manifest=manifest,
                                 config_yaml=yaml.safe_dump(config, sort_keys=False), summary=summary, tables=tables)
        for rel, text in (texts or {}).items():
            (local / rel).write_text(redact_text(text))
        for rel, folder in (folders or {}).items():
            shutil.copytree(folder, local / rel, dirs_exist_ok=True)
            redact_files(local / rel)
        upload_run_folder(store, prefix, local)
        tracker.log_params(run_id, params)
        tracker.log_metrics(run_id, metrics)
        if step_rows:
            tracker.log_step_rows(run_id, step_rows)
        tracker.set_tags(run_id, tags)
        tracker.log_artifact(run_id, local)  # through the server's artifact proxy when there is one
    links = {"MLflow run": tracker.run_url(run_id)} if tracker.tracking_uri.startswith("http") else None
    write_run_index(store, prefix, links)
    return warehouse.ingest_run(store, prefix)


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
        pq.write_table(redact_table(table), dest)
    return local


def redact_table(table: pa.Table) -> pa.Table:
    """`table` with its string columns redacted: every value of a column named like a secret (`is_secret_key`)
    becomes `***`, and a URL's password inside any text is masked (`redact_text`). Top-level string columns only:
    the tables runs record keep their text there (completions, details, labels)."""
    for i, field in enumerate(table.schema):
        if not (pa.types.is_string(field.type) or pa.types.is_large_string(field.type)):
            continue
        col = table.column(i)
        if is_secret_key(field.name):
            values = [v if v in (None, "") else REDACTED for v in col.to_pylist()]
        elif pc.any(pc.match_substring_regex(col, URL_WITH_USERINFO.pattern)).as_py():  # rare: only then in Python
            values = [v if v is None else redact_text(v) for v in col.to_pylist()]
        else:
            continue
        table = table.set_column(i, field, pa.array(values, field.type))
    return table


# Files of a copied folder that are read as text and redacted like a report.
TEXT_SUFFIXES = frozenset({".md", ".txt", ".json", ".jsonl", ".yaml", ".yml", ".csv", ".html", ".svg"})


def redact_files(folder: Path) -> None:
    """Redact a copied folder in place: its Parquet tables (`redact_table`) and text files (`redact_text`)."""
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        if f.suffix == ".parquet":
            table = pq.read_table(f)
            redacted = redact_table(table)
            if redacted is not table:
                pq.write_table(redacted, f)
        elif f.suffix in TEXT_SUFFIXES:
            text = f.read_text(encoding="utf-8", errors="replace")
            if redact_text(text) != text:
                f.write_text(redact_text(text), encoding="utf-8")


def upload_run_folder(store: ArtifactStore, prefix: str, local: Path) -> list[str]:
    """Upload everything, run.json last: a reader that sees run.json sees a complete run."""
    files = sorted(p for p in local.rglob("*") if p.is_file())
    keys = [store.put_file(join(prefix, f.relative_to(local).as_posix()), f) for f in files if f.name != "run.json"]
    keys.append(store.put_file(join(prefix, "run.json"), local / "run.json"))
    return keys
