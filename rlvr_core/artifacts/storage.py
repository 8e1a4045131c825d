"""The artifact store: one interface over a local folder and S3.

Keys are `/`-separated paths relative to the store root, the same on both backends, so a run's
layout (`<experiment>/<run_id>/manifest.json`, …) reads identically from a laptop folder and a
bucket. Writes are atomic on both: a local file is written to a temp name and renamed; an S3 object
appears whole or not at all.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path
from urllib.parse import urlparse

from rlvr_core.core import settings


class ArtifactStore(ABC):
    uri: str

    @abstractmethod
    def put_bytes(self, key: str, data: bytes) -> str: ...

    @abstractmethod
    def create(self, key: str, data: bytes) -> bool:
        """Write `key` only if it does not exist yet, atomically: of several concurrent writers (processes,
        hosts) exactly one gets True; the others get False and the object keeps the winner's bytes."""

    @abstractmethod
    def get_bytes(self, key: str) -> bytes: ...

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """All keys under `prefix` (recursive), sorted."""

    @abstractmethod
    def sizes(self, prefix: str = "") -> dict[str, int]:
        """{key: size in bytes} for all keys under `prefix` (recursive)."""

    @abstractmethod
    def url(self, key: str) -> str:
        """A URI a person or another tool can open (a path or s3://…)."""

    def folders(self, prefix: str = "") -> list[str]:
        """The names of the folders right below `prefix`, sorted."""
        base = prefix.strip("/")
        cut = len(base) + 1 if base else 0
        return sorted({k[cut:].split("/", 1)[0] for k in self.list(base) if "/" in k[cut:]})

    def put_file(self, key: str, local: str | Path) -> str:
        return self.put_bytes(key, Path(local).read_bytes())

    def get_file(self, key: str, local: str | Path) -> Path:
        dest = Path(local)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(self.get_bytes(key))
        return dest

    def put_dir(self, prefix: str, local_dir: str | Path) -> list[str]:
        root = Path(local_dir)
        keys = []
        for f in sorted(p for p in root.rglob("*") if p.is_file()):
            keys.append(self.put_file(join(prefix, f.relative_to(root).as_posix()), f))
        return keys

    def get_dir(self, prefix: str, local_dir: str | Path, skip: tuple[str, ...] = ()) -> list[Path]:
        """Copy every key under `prefix` into `local_dir`, keeping relative paths; keys whose path
        below `prefix` starts with one of `skip` (e.g. "checkpoints/") are left out."""
        base = prefix.strip("/")
        out = []
        for key in self.list(base):
            rel = key[len(base) + 1:] if base else key
            if rel and not rel.startswith(skip):
                out.append(self.get_file(key, Path(local_dir) / rel))
        return out

    def put_text(self, key: str, text: str) -> str:
        return self.put_bytes(key, text.encode())

    def get_text(self, key: str) -> str:
        return self.get_bytes(key).decode()

    def sha256(self, key: str) -> str:
        return hashlib.sha256(self.get_bytes(key)).hexdigest()


def join(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


def _check_key(key: str) -> str:
    k = key.strip("/")
    if not k or any(part in ("", ".", "..") for part in k.split("/")):
        raise ValueError(f"bad artifact key {key!r}: keys are relative paths without '.' or '..' parts")
    return k


class LocalStore(ArtifactStore):
    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser().resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.uri = str(self.root)

    def _path(self, key: str) -> Path:
        return self.root / _check_key(key)

    def _staged(self, key: str, data: bytes) -> tuple[Path, str]:
        """(destination, a temporary file beside it holding `data`): renamed or linked into place whole."""
        dest = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return dest, tmp

    def put_bytes(self, key: str, data: bytes) -> str:
        dest, tmp = self._staged(key, data)
        os.replace(tmp, dest)
        return _check_key(key)

    def create(self, key: str, data: bytes) -> bool:
        dest, tmp = self._staged(key, data)
        try:  # a hard link fails if the name exists: the file appears whole, and only once
            os.link(tmp, dest)
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    def put_file(self, key: str, local: str | Path) -> str:
        dest = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".tmp-")
        os.close(fd)
        shutil.copyfile(local, tmp)
        os.replace(tmp, dest)
        return _check_key(key)

    def get_bytes(self, key: str) -> bytes:
        p = self._path(key)
        if not p.is_file():
            raise FileNotFoundError(f"no artifact {key!r} in {self.uri}")
        return p.read_bytes()

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "") -> list[str]:
        base = self.root / prefix.strip("/") if prefix.strip("/") else self.root
        if base.is_file():
            return [prefix.strip("/")]
        if not base.is_dir():
            return []
        return sorted(
            p.relative_to(self.root).as_posix()
            for p in base.rglob("*")
            if p.is_file() and not p.name.startswith(".tmp-")
        )

    def sizes(self, prefix: str = "") -> dict[str, int]:
        return {k: (self.root / k).stat().st_size for k in self.list(prefix)}

    def folders(self, prefix: str = "") -> list[str]:
        base = self.root / prefix.strip("/") if prefix.strip("/") else self.root
        return sorted(p.name for p in base.iterdir() if p.is_dir()) if base.is_dir() else []

    def url(self, key: str) -> str:
        return str(self._path(key))


class S3Store(ArtifactStore):
    """S3 (or any S3 API: MinIO, moto_server) through boto3. `endpoint_url` overrides AWS."""

    def __init__(self, bucket: str, prefix: str = "", endpoint_url: str | None = None):
        import boto3  # imported here: local-only users never pay for it

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url
        self.client = boto3.client("s3", endpoint_url=endpoint_url)
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"

    def _key(self, key: str) -> str:
        return join(self.prefix, _check_key(key))

    def put_bytes(self, key: str, data: bytes) -> str:
        self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)
        return _check_key(key)

    def create(self, key: str, data: bytes) -> bool:
        from botocore.exceptions import ClientError

        try:  # S3 conditional write: If-None-Match: * fails with 412 when the key exists
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, IfNoneMatch="*")
            return True
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict", "412"):
                return False
            raise

    def put_file(self, key: str, local: str | Path) -> str:
        self.client.upload_file(str(local), self.bucket, self._key(key))
        return _check_key(key)

    def get_bytes(self, key: str) -> bytes:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except self.client.exceptions.NoSuchKey:
            raise FileNotFoundError(f"no artifact {key!r} in {self.uri}") from None

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise

    def list(self, prefix: str = "") -> list[str]:
        return sorted(self.sizes(prefix))

    def sizes(self, prefix: str = "") -> dict[str, int]:
        full = join(self.prefix, prefix.strip("/"))
        # Under a store prefix, list "prefix/…" only, never a sibling "prefix-other/…".
        s3_prefix = full + "/" if full and not prefix.strip("/") else full
        out = {}
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=s3_prefix):
            for obj in page.get("Contents", []):
                k = obj["Key"]
                # S3 prefixes are plain string prefixes: keep "a/b" and "a/b/…", not "a/bc".
                if full and not (k == full or k.startswith(full + "/")):
                    continue
                out[k[len(self.prefix) + 1:] if self.prefix else k] = int(obj["Size"])
        return out

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._key(key)}"

    def folders(self, prefix: str = "") -> list[str]:
        """One delimited listing, not every key below (a sweep folder holds hundreds)."""
        full = join(self.prefix, prefix.strip("/"))
        out = set()
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=full + "/" if full else "", Delimiter="/")
        for page in pages:
            out.update(cp["Prefix"].rstrip("/").rsplit("/", 1)[-1] for cp in page.get("CommonPrefixes", []))
        return sorted(out)


def open_store(uri: str | None = None, endpoint_url: str | None = None) -> ArtifactStore:
    """`s3://bucket/prefix` → S3Store; a path or file:// URI → LocalStore. None → configured default."""
    uri = settings.artifact_uri(uri)
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"artifact URI {uri!r} names no bucket")
        return S3Store(parsed.netloc, parsed.path, settings.s3_endpoint_url(endpoint_url))
    if parsed.scheme == "file":
        return LocalStore(parsed.path)
    if parsed.scheme and len(parsed.scheme) > 1:
        raise ValueError(f"unsupported artifact URI scheme {parsed.scheme!r} in {uri!r} (use a path or s3://)")
    return LocalStore(uri)
