"""The DuckDB results warehouse: derived from per-run files, rebuildable, one writer at a time.

Source of truth is the artifact store: every run writes `run.json`, `params.json` and Parquet tables
under `<experiment>/<run_id>/` (the files and the table each fills are in `RUN_FILES` below and in
docs/warehouse.md). `ingest_run` copies one run into the `.duckdb` file: delete-then-insert in one
transaction, so re-ingesting gives the same rows. Each ingest records a content fingerprint of the files
it read (`ingest_log`); a run whose files have not changed is skipped, so `ingest_all` over a whole store
resumes where an interrupted one stopped. `rebuild` recreates the file from the store (and resumes an
interrupted rebuild). DuckDB allows one writing process per file, so writers take an exclusive file lock
and wait for it instead of failing; readers open the file read-only.

Files are read through the ArtifactStore (a local folder or S3 via boto3, any endpoint), not DuckDB's
httpfs: httpfs is an extension DuckDB downloads at first use, and these machines reach no network.

Schema changes are numbered migrations (`MIGRATIONS`, in `warehouse_schema.py` with the file-to-table map),
applied in order and recorded in `schema_migrations`; a migration never edits an earlier one.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import fcntl
import hashlib
import io
import json
import math
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from rlvr_core.artifacts.layout import find_run_folders
from rlvr_core.artifacts.storage import ArtifactStore, join
from rlvr_core.core import settings

from rlvr_core.records.warehouse_schema import (CHECKPOINT_MANIFEST, MIGRATIONS, PROBE_FILES, RUN_FILES,
                                               RUN_TABLES)


class IngestError(ValueError):
    """A run folder's file cannot be ingested; the message names the file and the field."""


def migrate(con: duckdb.DuckDBPyConnection) -> list[int]:
    """Apply pending migrations; returns the versions applied now."""
    con.execute("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR, applied_at TIMESTAMP)")
    done = {r[0] for r in con.execute("SELECT version FROM schema_migrations").fetchall()}
    applied = []
    for version, name, sql in MIGRATIONS:
        if version in done:
            continue
        con.execute("BEGIN")
        try:
            con.execute(sql)
            con.execute("INSERT INTO schema_migrations VALUES (?, ?, now())", [version, name])
            con.execute("COMMIT")
        except Exception:
            con.execute("ROLLBACK")
            raise
        applied.append(version)
    return applied


@contextlib.contextmanager
def writer(path: str | Path | None = None, wait_s: float = 600.0) -> Iterator[duckdb.DuckDBPyConnection]:
    """The one writer: an exclusive lock file beside the database, then a migrated connection."""
    db = Path(path) if path else settings.warehouse_path()
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(str(db) + ".lock", "w") as lock:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"another process has held the warehouse writer lock on {db} for {wait_s:.0f} s")
                time.sleep(0.2)
        con = duckdb.connect(str(db))
        try:
            migrate(con)
            yield con
        finally:
            _SCHEMAS.pop(id(con), None)
            con.close()
            fcntl.flock(lock, fcntl.LOCK_UN)


def reader(path: str | Path | None = None) -> duckdb.DuckDBPyConnection:
    db = Path(path) if path else settings.warehouse_path()
    if not db.exists():
        raise FileNotFoundError(f"no warehouse at {db}: run `rlvr demo` or `rlvr warehouse rebuild` first")
    return duckdb.connect(str(db), read_only=True)


# Column lists per table, read once per writer connection (one catalog query instead of two per table
# per run: at a few ms each they were a visible share of ingesting many small runs).
_SCHEMAS: dict[int, dict[str, tuple[list[str], set[str]]]] = {}


def _schema(con: duckdb.DuckDBPyConnection, table: str) -> tuple[list[str], set[str]]:
    """(columns in order, NOT NULL columns) of `table`."""
    cached = _SCHEMAS.get(id(con))
    if cached is None or table not in cached:
        cached = {}
        for t, c, nullable in con.execute("SELECT table_name, column_name, is_nullable FROM duckdb_columns() "
                                          "WHERE schema_name = 'main' ORDER BY table_name, column_index").fetchall():
            cols, required = cached.setdefault(t, ([], set()))
            cols.append(c)
            if not nullable:
                required.add(c)
        _SCHEMAS[id(con)] = cached
    return cached[table]


def _table_columns(con: duckdb.DuckDBPyConnection, table: str) -> list[str]:
    return _schema(con, table)[0]


# ------------------------------------------------------------------------------------------- reading
class _RunFiles:
    """The files of one run folder, read once: their bytes feed both the fingerprint and the tables."""

    def __init__(self, store: ArtifactStore, run_prefix: str):
        self.store, self.prefix = store, run_prefix.strip("/")
        # One listing instead of an existence check per file (each one a request on S3).
        self.names = {k[len(self.prefix) + 1:] for k in store.list(self.prefix)}
        if "run.json" not in self.names:
            raise IngestError(f"{store.url(join(self.prefix, 'run.json'))}: no run.json (is {run_prefix!r} a run folder?)")
        wanted = {"run.json", "params.json", *RUN_FILES.values()}
        self.read = sorted(n for n in self.names if n in wanted or _is_probe_file(n) or _is_checkpoint_manifest(n))
        self.data = {n: store.get_bytes(join(self.prefix, n)) for n in self.read}

    def url(self, name: str) -> str:
        return self.store.url(join(self.prefix, name))

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for n in self.read:
            h.update(f"{n}\0{hashlib.sha256(self.data[n]).hexdigest()}\n".encode())
        return h.hexdigest()

    def json(self, name: str) -> Any:
        try:
            return json.loads(self.data[name])
        except json.JSONDecodeError as e:
            raise IngestError(f"{self.url(name)}: not valid JSON: {e}") from None

    def parquet_rows(self) -> int:
        """Rows in the run's Parquet files, from their footers (no decoding); a bad file is named here."""
        total = 0
        for name in (n for n in self.read if n.endswith(".parquet")):
            try:
                total += pq.read_metadata(io.BytesIO(self.data[name])).num_rows
            except (pa.ArrowException, OSError) as e:
                raise IngestError(f"{self.url(name)}: not a readable Parquet file: {e}") from None
        return total

    def parquet(self, name: str) -> pa.Table:
        try:
            return pq.read_table(io.BytesIO(self.data[name]))
        except (pa.ArrowException, OSError) as e:
            raise IngestError(f"{self.url(name)}: not a readable Parquet file: {e}") from None


def _is_probe_file(name: str) -> bool:
    return name.split("/", 1)[0] in ("probe", "probes") and name.rsplit("/", 1)[-1] in PROBE_FILES.values()


def _is_checkpoint_manifest(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 3 and parts[0] == "checkpoints" and parts[2] == CHECKPOINT_MANIFEST


def _run_row(files: _RunFiles) -> dict[str, Any]:
    run = files.json("run.json")
    if not isinstance(run, dict):
        raise IngestError(f"{files.url('run.json')}: expected a JSON object, got {type(run).__name__}")
    for field in ("run_id", "experiment"):
        if not run.get(field):
            raise IngestError(f"{files.url('run.json')}: field {field!r} is missing or empty")
    return run


def _tags(run: dict[str, Any]) -> list[tuple[str, str | None]]:
    """run.json `tags`: a {key: value} object, or a list of bare tags (value 'true')."""
    tags = run.get("tags") or {}
    if isinstance(tags, list):
        return [(str(t), "true") for t in tags]
    return [(str(k), None if v is None else str(v)) for k, v in sorted(tags.items())]


def _checkpoint_row(files: _RunFiles, name: str) -> dict[str, Any]:
    m = files.json(name)
    where = files.url(name)
    if not isinstance(m, dict) or not isinstance(m.get("files"), list):
        raise IngestError(f"{where}: field 'files' is missing (not an export manifest?)")
    try:
        total = sum(int(f["size"]) for f in m["files"])
    except (KeyError, TypeError, ValueError):
        raise IngestError(f"{where}: field 'files[].size' is missing or not a number") from None
    folder = name.rsplit("/", 1)[0]
    return {"checkpoint": folder.split("/")[1], "step": m.get("step"), "tag": m.get("tag"), "dtype": m.get("dtype"),
            "zero_stage": m.get("zero_stage"), "uri": files.url(folder),
            "manifest_sha256": hashlib.sha256(files.data[name]).hexdigest(),
            "n_parameters": (m.get("model") or {}).get("n_parameters"), "n_files": len(m["files"]),
            "total_bytes": total, "created_at": m.get("created_at"), "model_class": (m.get("model") or {}).get("class")}


def _with_json_column(data: pa.Table, column: str) -> pa.Table:
    """A struct/map/list column (e.g. a firing's evidence dict) stored as JSON text."""
    if column not in data.column_names or pa.types.is_string(data.schema.field(column).type):
        return data
    values = [None if v is None else json.dumps(_json_safe(v), sort_keys=True) for v in data.column(column).to_pylist()]
    return data.set_column(data.column_names.index(column), column, pa.array(values, pa.string()))


# ------------------------------------------------------------------------------------------- writing
def _insert_arrow(con: duckdb.DuckDBPyConnection, table: str, data: pa.Table, run_id: str, where: str) -> int:
    """Insert the columns `table` knows (by name); columns the file lacks become NULL."""
    known, required = _schema(con, table)
    missing = [c for c in known if c in required and c != "run_id" and c not in data.column_names]
    if missing:
        raise IngestError(f"{where}: column {missing[0]!r} is missing (required by warehouse table {table}; "
                          f"the file has {', '.join(data.column_names) or 'no columns'})")
    cols = [c for c in known if c in data.column_names and c != "run_id"]
    if not cols or data.num_rows == 0:
        return 0
    name = f"_src_{uuid.uuid4().hex}"
    con.register(name, data.select(cols))
    try:
        quoted = ", ".join(f'"{c}"' for c in cols)
        con.execute(f'INSERT INTO {table} (run_id, {quoted}) SELECT ?, {quoted} FROM {name}', [run_id])
    except duckdb.Error as e:  # a type that does not cast, a NULL in a NOT NULL column, …
        raise IngestError(f"{where}: cannot load into warehouse table {table}: {e}") from None
    finally:
        con.unregister(name)
    return data.num_rows


def _insert_rows(con: duckdb.DuckDBPyConnection, table: str, rows: list[dict[str, Any]], run_id: str, where: str) -> int:
    if not rows:
        return 0
    known = set(_table_columns(con, table))
    keys = [k for k in dict.fromkeys(k for r in rows for k in r) if k in known and k != "run_id"]
    return _insert_arrow(con, table, pa.Table.from_pylist([{k: r.get(k) for k in keys} for r in rows]), run_id, where)


def _delete_run(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    con.execute("DELETE FROM runs WHERE run_id = ?", [run_id])
    for t in RUN_TABLES:
        con.execute(f"DELETE FROM {t} WHERE run_id = ?", [run_id])
    con.execute("DELETE FROM ingest_log WHERE run_id = ?", [run_id])


def _load_run(con: duckdb.DuckDBPyConnection, files: _RunFiles, run: dict[str, Any]) -> dict[str, int]:
    """Insert every table of one run (the caller holds the transaction and has deleted the old rows)."""
    run_id = run["run_id"]
    counts: dict[str, int] = {}
    cols = [c for c in _table_columns(con, "runs") if c in run]
    try:
        con.execute(f"INSERT INTO runs ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})", [run[c] for c in cols])
    except duckdb.Error as e:
        raise IngestError(f"{files.url('run.json')}: cannot load into warehouse table runs: {e}") from None
    counts["runs"] = 1
    params = files.json("params.json") if "params.json" in files.data else {}
    counts["run_params"] = _insert_rows(con, "run_params", [{"key": k, "value": None if v is None else str(v)}
                                                             for k, v in sorted(params.items())], run_id,
                                        files.url("params.json"))
    counts["run_tags"] = _insert_rows(con, "run_tags", [{"key": k, "value": v} for k, v in _tags(run)], run_id,
                                      files.url("run.json"))
    for table, name in RUN_FILES.items():
        data = files.parquet(name) if name in files.data else None
        if table == "health_events" and data is not None:
            data = _with_json_column(data, "evidence")
            if "source" not in data.column_names:
                data = data.append_column("source", pa.array(["firings"] * data.num_rows, pa.string()))
        counts[table] = _insert_arrow(con, table, data, run_id, files.url(name)) if data is not None else 0
    if "train/health_events.parquet" not in files.data:
        # No firings file (runs from before it existed, or a demo flow that does not write it): the per-step
        # health/<guard> flags in train_steps still say at which steps a guard fired.
        counts["health_events"] = con.execute(
            "INSERT INTO health_events (run_id, step, guard_id, source, last_step, n_steps) SELECT run_id, step, "
            "substr(metric, 8), 'train_steps', step, 1 FROM train_steps "
            "WHERE run_id = ? AND metric LIKE 'health/%' AND value > 0",
            [run_id]).fetchone()[0]
    manifests = [n for n in files.read if _is_checkpoint_manifest(n)]
    counts["checkpoints"] = sum(_insert_rows(con, "checkpoints", [_checkpoint_row(files, n)], run_id, files.url(n))
                                for n in manifests)
    for table, base in PROBE_FILES.items():
        counts[table] = 0
        for name in (n for n in files.read if _is_probe_file(n) and n.endswith("/" + base)):
            data = files.parquet(name)
            folder = name.rsplit("/", 1)[0]
            if "probe_id" not in data.column_names and "/" in folder:
                data = data.append_column("probe_id", pa.array([folder.split("/")[-1]] * data.num_rows, pa.string()))
            counts[table] += _insert_arrow(con, table, data, run_id, files.url(name))
    return counts


# ingest_all commits once at least this many rows are pending. Fewer, larger transactions load faster
# (measured on 1M rows in 10 runs: one transaction 14.4 s, 250k-row batches 19.1 s, one per run 23.8 s on a
# busy 2-core machine): DuckDB writes big transactions straight into the database file, small ones go
# through the WAL and are written again at the next checkpoint. An interruption loses at most the open
# batch (its runs are read again by the next call); the batch's files are held in memory until commit.
BATCH_ROWS = 1_000_000


def _ingest_batch(con: duckdb.DuckDBPyConnection, batch: list[tuple[_RunFiles, dict[str, Any], str]]) -> list[dict[str, int]]:
    """Replace the runs of `batch` in one transaction; all or nothing."""
    con.execute("BEGIN")
    try:
        known = {r[0] for r in con.execute("SELECT run_id FROM ingest_log UNION SELECT run_id FROM runs").fetchall()}
        out = []
        for files, run, fingerprint in batch:
            if run["run_id"] in known:  # a new run has nothing to delete: skip the scans of every table
                _delete_run(con, run["run_id"])
            counts = _load_run(con, files, run)
            con.execute("INSERT INTO ingest_log VALUES (?, ?, ?, ?, ?, now())",
                        [run["run_id"], files.prefix, fingerprint, json.dumps(files.read), json.dumps(counts)])
            known.add(run["run_id"])  # run ids are global: a second folder with the same id replaces the first
            out.append(counts)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return out


def _ingest_runs(con: duckdb.DuckDBPyConnection, store: ArtifactStore, prefixes: list[str], force: bool,
                 batch_rows: int) -> dict[str, Any]:
    out: dict[str, Any] = {"ingested": [], "skipped": [], "pruned": [], "rows": {}}
    done = {r[0]: (r[1], r[2]) for r in con.execute("SELECT run_id, fingerprint, row_counts FROM ingest_log").fetchall()}
    batch: list[tuple[_RunFiles, dict[str, Any], str]] = []

    def add(run_id: str, counts: dict[str, int], skipped: bool) -> None:
        out["skipped" if skipped else "ingested"].append(run_id)
        for t, n in counts.items():
            out["rows"][t] = out["rows"].get(t, 0) + n

    def flush() -> None:
        try:
            results = _ingest_batch(con, batch)
        except IngestError:
            # Keep the good runs before the bad one (they were read fine), then report the bad one.
            good = []
            for item in batch:
                try:
                    _ingest_batch(con, [item])
                    good.append(item)
                except IngestError:
                    break
            for files, run, _ in good:
                add(run["run_id"], json.loads(con.execute("SELECT row_counts FROM ingest_log WHERE run_id = ?",
                                                          [run["run_id"]]).fetchone()[0]), False)
            raise
        for (files, run, _), counts in zip(batch, results):
            add(run["run_id"], counts, False)
        batch.clear()

    pending = 0
    for prefix in prefixes:
        try:
            files = _RunFiles(store, prefix)
            run = _run_row(files)
            n_rows = files.parquet_rows()
        except BaseException:
            if batch:  # commit the runs read so far, so the next call resumes after them
                flush()
            raise
        fingerprint = files.fingerprint()
        prev = done.get(run["run_id"])
        if not force and prev and prev[0] == fingerprint:
            add(run["run_id"], json.loads(prev[1]), True)
            continue
        batch.append((files, run, fingerprint))
        pending += n_rows
        if pending >= batch_rows:
            flush()
            pending = 0
    if batch:
        flush()
    return out


def ingest_run(store: ArtifactStore, run_prefix: str, path: str | Path | None = None,
               force: bool = False) -> dict[str, int]:
    """Copy one run folder (`<experiment>/<run_id>`) into the warehouse; idempotent. Returns rows per table.

    A run whose files are byte-identical to its last ingest is skipped (same rows either way);
    `force` re-reads it regardless."""
    with writer(path) as con:
        return _ingest_runs(con, store, [run_prefix], force, 0)["rows"]


def ingest_all(store: ArtifactStore, path: str | Path | None = None, force: bool = False,
               prune: bool = False, batch_rows: int = BATCH_ROWS) -> dict[str, Any]:
    """Ingest every run folder in the store under one writer lock. Unchanged runs are skipped and runs are
    committed in batches of about `batch_rows` rows, so an interrupted call resumes where its last batch
    ended. `prune` also deletes runs whose folder is gone.
    Returns {"ingested": [...], "skipped": [...], "pruned": [...], "rows": {table: rows of these runs}}."""
    with writer(path) as con:
        out = _ingest_runs(con, store, find_runs(store), force, batch_rows)
        if prune:
            seen = set(out["ingested"]) | set(out["skipped"])
            for (run_id,) in con.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall():
                if run_id not in seen:
                    con.execute("BEGIN")
                    _delete_run(con, run_id)
                    con.execute("COMMIT")
                    out["pruned"].append(run_id)
    return out


def find_runs(store: ArtifactStore) -> list[str]:
    """Run folders in the store: every folder holding a run.json, at any depth below its experiment
    (`<experiment>/<run>/`, and sweep trials' `<experiment>/<sweep>/<trial>/`; docs/artifacts.md)."""
    return find_run_folders(store)


def rebuild(store: ArtifactStore, path: str | Path | None = None) -> dict[str, int]:
    """Recreate the warehouse from the artifact store. Returns total rows per table.

    Built beside the database and swapped in at the end, so readers see the old file until then. An
    interrupted rebuild leaves its partial file; the next rebuild continues it (runs already in it
    with unchanged files are skipped, runs no longer in the store are pruned)."""
    db = Path(path) if path else settings.warehouse_path()
    tmp = db.with_name(db.name + ".rebuild")
    totals = ingest_all(store, tmp, prune=True)["rows"]
    Path(str(tmp) + ".lock").unlink(missing_ok=True)
    with open(str(db) + ".lock", "w") as lock:  # swap in under the writer lock
        fcntl.flock(lock, fcntl.LOCK_EX)
        tmp.replace(db)
        Path(str(db) + ".wal").unlink(missing_ok=True)
    return totals


def health_events_table(firings: list[dict[str, Any]]) -> pa.Table:
    """`train/health_events.parquet` from guard events, in the warehouse's column types (evidence as JSON
    text, so every run's file has the same schema): run-level firings (rlvr_core.experiment.guards.firing_dict),
    per-step flag episodes (rlvr_core.grpo.step_metrics.StepGuards; `last_step`, `n_steps`, source
    'step_flags') and evaluation flags (`eval_flag_events`, source 'eval'). This file is the run's source of
    truth: the warehouse derives events from the health/* step columns only for a run without it."""
    schema = pa.schema([("step", pa.int64()), ("guard_id", pa.string()), ("serious", pa.bool_()),
                        ("reason", pa.string()), ("evidence", pa.string()), ("key", pa.string()),
                        ("last_step", pa.int64()), ("n_steps", pa.int64()), ("source", pa.string())])
    rows = [{"step": int(f["step"]), "guard_id": f["guard_id"], "serious": bool(f.get("serious")),
             "reason": f.get("reason"), "evidence": json.dumps(_json_safe(f.get("evidence") or {}), sort_keys=True),
             "key": f.get("key") or "", "last_step": int(f.get("last_step", f["step"])),
             "n_steps": int(f.get("n_steps", 1)), "source": f.get("source") or "firings"} for f in firings]
    return pa.Table.from_pylist(rows, schema=schema)


def eval_flag_events(flags: list[dict[str, Any]], step: int, eval_id: str) -> list[dict[str, Any]]:
    """Health events of an evaluation's flags (rlvr_core.eval.evaluate.eval_flags) at the training `step` of
    the evaluated checkpoint (0: the base model), keyed `<eval id>/<metric>`."""
    return [{"guard_id": f["guard_id"], "step": step, "serious": False, "reason": f"{eval_id}: {f['reason']}",
             "evidence": {k: f[k] for k in ("benchmark", "metric", "value", "n", "limit")},
             "key": f"{eval_id}/{f['metric']}", "source": "eval"} for f in flags]


def _json_safe(v: Any) -> Any:
    if isinstance(v, (dt.datetime, dt.date, dt.time)):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return float(v)
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    if isinstance(v, (bytes, bytearray)):
        return v.hex()
    if isinstance(v, uuid.UUID):
        return str(v)
    if isinstance(v, dict):
        return {k: _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    return v


def query(sql: str, params: list[Any] | dict[str, Any] | None = None, path: str | Path | None = None) -> tuple[list[str], list[tuple]]:
    """Run SQL read-only; returns (column names, rows)."""
    con = reader(path)
    try:
        cur = con.execute(sql, params or [])
        cols = [d[0] for d in cur.description] if cur.description else []
        return cols, cur.fetchall()
    finally:
        con.close()


def query_records(sql: str, params: list[Any] | dict[str, Any] | None = None, path: str | Path | None = None) -> list[dict[str, Any]]:
    """Rows as JSON-safe dicts (timestamps as ISO strings, NaN as null)."""
    cols, rows = query(sql, params, path)
    return [{c: _json_safe(v) for c, v in zip(cols, row)} for row in rows]
