"""The local stack's S3: moto's S3 server, with every bucket and object also kept on disk.

`moto_server` keeps objects in memory, so stopping it lost every artifact and checkpoint. This server is
the same moto application behind a small WSGI layer that, after each successful write (PUT object, copy,
completed multipart upload, DELETE, bulk delete, bucket create/delete), writes the object's bytes and
metadata under `--data DIR` before answering; at start it loads DIR back into moto. So a client that got
a 200 has its object on disk, a restart (or a crash) keeps it, and a write that could not be kept answers
500 instead of pretending.

On disk (a person can browse it):
    DIR/index.sqlite                 buckets, and per object: key, file, metadata, etag, last-modified
    DIR/<bucket>/<key>               the object's bytes, at its key's path when that path is usable
    DIR/.objects/<sha256>            objects whose key is not a usable path (`..`, `//`, a trailing `/`,
                                     a key that is also a folder of other keys)

Kept: buckets, objects (the latest version), their metadata and ETag. Not kept: bucket policies,
versioning history, tags, multipart uploads still in progress.

    python -m rlvr_core.artifacts.s3_local --host 127.0.0.1 --port 9000 --data DIR
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import ipaddress
import json
import logging
import os
import sqlite3
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterable
from urllib.parse import parse_qs, unquote

log = logging.getLogger("rlvr.s3_local")
REGION = "us-east-1"
WRITES = ("PUT", "POST", "DELETE")

SCHEMA = """
CREATE TABLE IF NOT EXISTS buckets (name TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS objects (bucket TEXT, key TEXT, file TEXT, metadata TEXT, etag TEXT,
                                    last_modified TEXT, PRIMARY KEY (bucket, key));
"""


class DiskStore:
    """Buckets and objects mirrored to a folder; one lock serialises writers."""

    def __init__(self, root: Path):
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.lock = threading.Lock()
        self.db = sqlite3.connect(self.root / "index.sqlite", check_same_thread=False, isolation_level=None)
        self.db.executescript("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;" + SCHEMA)

    # ------------------------------------------------------------------------------------------ paths
    def _plain_path(self, bucket: str, key: str) -> Path | None:
        """DIR/<bucket>/<key> when every segment is a usable file name and nothing is in the way."""
        parts = key.split("/")
        if any(p in ("", ".", "..") or "\x00" in p or len(p.encode()) > 255 for p in parts):
            return None
        if bucket.startswith("."):
            return None
        path = self.root / bucket / Path(*parts)
        for parent in list(path.parents)[: len(parts)]:
            if parent.exists() and not parent.is_dir():
                return None  # an object "a" is in the way of "a/b"
        return None if path.is_dir() else path

    def _path_for(self, bucket: str, key: str) -> Path:
        return self._plain_path(bucket, key) or \
            self.root / ".objects" / hashlib.sha256(f"{bucket}/{key}".encode()).hexdigest()

    # ------------------------------------------------------------------------------------------ writes
    def put_bucket(self, bucket: str) -> None:
        self.db.execute("INSERT OR IGNORE INTO buckets VALUES (?)", (bucket,))

    def delete_bucket(self, bucket: str) -> None:
        for (key,) in self.db.execute("SELECT key FROM objects WHERE bucket = ?", (bucket,)).fetchall():
            self.delete_object(bucket, key)
        self.db.execute("DELETE FROM buckets WHERE name = ?", (bucket,))

    def put_object(self, bucket: str, key: str, value: bytes, metadata: dict[str, Any], etag: str,
                   last_modified: str) -> None:
        old = self.db.execute("SELECT file FROM objects WHERE bucket = ? AND key = ?", (bucket, key)).fetchone()
        path = Path(old[0]) if old and Path(old[0]).is_file() else self._path_for(bucket, key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{threading.get_ident()}")
        with open(tmp, "wb") as f:
            f.write(value)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        self.db.execute("INSERT OR REPLACE INTO objects VALUES (?, ?, ?, ?, ?, ?)",
                        (bucket, key, str(path), json.dumps(metadata), etag, last_modified))

    def delete_object(self, bucket: str, key: str) -> None:
        row = self.db.execute("SELECT file FROM objects WHERE bucket = ? AND key = ?", (bucket, key)).fetchone()
        self.db.execute("DELETE FROM objects WHERE bucket = ? AND key = ?", (bucket, key))
        if row:
            Path(row[0]).unlink(missing_ok=True)
            self._prune(Path(row[0]).parent)

    def _prune(self, folder: Path) -> None:
        """Remove folders left empty by a delete, up to the bucket's folder."""
        while folder != self.root and self.root in folder.parents and folder.parent != self.root:
            try:
                folder.rmdir()
            except OSError:
                return
            folder = folder.parent

    # ------------------------------------------------------------------------------------------- reads
    def buckets(self) -> list[str]:
        return [b for (b,) in self.db.execute("SELECT name FROM buckets ORDER BY name")]

    def objects(self, bucket: str) -> Iterable[tuple[str, Path, dict[str, Any], str, str]]:
        rows = self.db.execute("SELECT key, file, metadata, etag, last_modified FROM objects WHERE bucket = ? "
                               "ORDER BY key", (bucket,)).fetchall()
        for key, file, metadata, etag, last_modified in rows:
            yield key, Path(file), json.loads(metadata), etag, last_modified

    def keys(self, bucket: str) -> set[str]:
        return {k for (k,) in self.db.execute("SELECT key FROM objects WHERE bucket = ?", (bucket,))}


# ---------------------------------------------------------------------------------------- moto glue
def _backend():
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    return s3_backends[DEFAULT_ACCOUNT_ID]["aws"]


def restore(store: DiskStore) -> tuple[int, int]:
    """Load every kept bucket and object into moto; returns (buckets, objects)."""
    backend, n = _backend(), 0
    for bucket in store.buckets():
        backend.create_bucket(bucket, REGION)
        for key, path, metadata, etag, last_modified in store.objects(bucket):
            if not path.is_file():
                log.error("s3 store: %s/%s: its file %s is missing; not restored", bucket, key, path)
                continue
            obj = backend.put_object(bucket, key, path.read_bytes(), etag=etag, disable_notification=True)
            obj.set_metadata(metadata)
            obj.last_modified = datetime.datetime.fromisoformat(last_modified)
            n += 1
    return len(store.buckets()), n


def _sync_object(store: DiskStore, bucket: str, key: str) -> None:
    obj = _backend().get_object(bucket, key) if bucket in _backend().buckets else None
    if obj is None:
        store.delete_object(bucket, key)
    else:
        store.put_object(bucket, key, obj.value, dict(obj.metadata), obj.etag.strip('"'),
                         obj.last_modified.isoformat())


def _sync_bucket(store: DiskStore, bucket: str) -> None:
    backend = _backend()
    if bucket not in backend.buckets:
        store.delete_bucket(bucket)
        return
    store.put_bucket(bucket)
    live = set(backend.buckets[bucket].keys.keys())
    for key in store.keys(bucket) - live:
        store.delete_object(bucket, key)


def _target(environ: dict[str, Any]) -> tuple[str, str]:
    """(bucket, key): path-style (`/bucket/key`, what boto3 sends to an IP endpoint such as 127.0.0.1) or
    virtual-hosted (`bucket.localhost:9000` + `/key`)."""
    path = unquote(environ.get("PATH_INFO", "")).lstrip("/")
    host = environ.get("HTTP_HOST", "").rsplit(":", 1)[0]
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        if "." in host and not path.startswith("moto-api"):
            return host.split(".", 1)[0], path
    bucket, _, key = path.partition("/")
    return bucket, key


def persist(store: DiskStore, method: str, environ: dict[str, Any]) -> None:
    """Mirror the effect of one successful write request to disk."""
    bucket, key = _target(environ)
    if not bucket or bucket == "moto-api":
        return
    query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
    if "uploadId" in query and method != "POST" or "uploads" in query:
        return  # a part, an abort or the start of a multipart upload: no object yet
    with store.lock:
        if key:
            _sync_object(store, bucket, key)
        elif method == "POST" and "delete" in query or method in ("PUT", "DELETE") and not query:
            _sync_bucket(store, bucket)  # bulk delete, bucket create or delete


class PersistingApp:
    """WSGI: moto answers; a successful write is on disk before the client hears so."""

    def __init__(self, app: Callable, store: DiskStore):
        self.app, self.store = app, store

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        method = environ["REQUEST_METHOD"]
        if method not in WRITES:
            return self.app(environ, start_response)
        captured: dict[str, Any] = {}

        def capture(status, headers, exc_info=None):
            captured.update(status=status, headers=headers)
            return lambda data: None

        result = self.app(environ, capture)
        try:
            body = b"".join(result)
        finally:
            getattr(result, "close", lambda: None)()
        if captured["status"].startswith("2"):
            try:
                persist(self.store, method, environ)
            except Exception as e:  # noqa: BLE001 — the client must learn the write is not kept
                log.exception("s3 store: could not keep %s %s", method, environ.get("PATH_INFO"))
                msg = f"<Error><Code>InternalError</Code><Message>not kept on disk: {e}</Message></Error>".encode()
                start_response("500 Internal Server Error", [("Content-Type", "application/xml"),
                                                             ("Content-Length", str(len(msg)))])
                return [msg]
        start_response(captured["status"], captured["headers"])
        return [body]


def serve(host: str, port: int, data: Path) -> None:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    store = DiskStore(data)
    app = DomainDispatcherApplication(create_backend_app)
    buckets, objects = restore(store)
    log.warning("s3 store %s: restored %d bucket(s), %d object(s); serving on %s:%d", store.root, buckets,
                objects, host, port)
    server = make_server(host, port, PersistingApp(app, store), threaded=True, request_handler=MotoRequestHandler)
    server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rlvr_core.artifacts.s3_local", description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=9000)
    ap.add_argument("--data", type=Path, required=True, help="folder that keeps the buckets and objects")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve(a.host, a.port, a.data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
