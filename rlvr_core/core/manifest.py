"""The run manifest: everything needed to say exactly what produced a result.

Written by every run next to its config: code version (git sha + dirty flag), config hash, content
hashes of the data sets, seeds, package versions, and model/tokenizer ids and hashes.
"""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

# The packages whose versions change numbers or behaviour; recorded with every run.
TRACKED_PACKAGES = ("torch", "transformers", "tokenizers", "deepspeed", "prefect", "mlflow", "duckdb",
                    "pyarrow", "sympy", "math-verify", "numpy", "vllm", "rlvr")

_CHUNK = 1 << 20


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def rows_sha256(rows: list[dict[str, Any]]) -> str:
    """Content hash of a data set given as rows: canonical JSON per row, in order."""
    h = hashlib.sha256()
    for row in rows:
        h.update(json.dumps(row, sort_keys=True, separators=(",", ":")).encode() + b"\n")
    return h.hexdigest()


def git_state(cwd: str | Path | None = None) -> dict[str, Any]:
    """{'sha': …, 'dirty': bool} of the repository holding the code; None values outside git."""
    where = Path(cwd) if cwd else Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=where,
                                capture_output=True, text=True, timeout=10, check=True).stdout
        return {"sha": sha, "dirty": bool(status.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"sha": None, "dirty": None}


def package_versions(names: tuple[str, ...] = TRACKED_PACKAGES) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def build_manifest(
    *,
    config_hash: str,
    resolved_config: dict[str, Any],
    datasets: dict[str, str],
    seeds: dict[str, int],
    model: dict[str, Any],
    template: str,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Assemble the manifest. `datasets` maps split name → content hash; `model` has id/hash/tokenizer_hash."""
    return {
        "schema": 1,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "code": git_state(),
        "config_hash": config_hash,
        "config": resolved_config,
        "datasets": datasets,
        "seeds": seeds,
        "model": model,
        "prompt_template": template,
        "packages": package_versions(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        **(extra or {}),
    }
