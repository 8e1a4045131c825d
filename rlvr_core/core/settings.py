"""Where state lives: one folder for the embedded stack, real services by configuration only.

Default: everything under `$RLVR_HOME` (default `./.rlvr`):

    .rlvr/
      prefect/           PREFECT_HOME for ephemeral Prefect (its own SQLite)
      mlflow/mlflow.db   MLflow tracking store (sqlite)
      mlflow/artifacts/  MLflow artifact root
      artifacts/         the run artifact store (config, manifest, tables, checkpoints, evals)
      cache/             content-addressed stage outputs (data, base model) reused across runs
      warehouse.duckdb   the DuckDB warehouse (derived from the artifact store; rebuildable)

Pointing at real services needs no code: set PREFECT_API_URL, MLFLOW_TRACKING_URI, and
RLVR_ARTIFACT_URI=s3://bucket/prefix (+ RLVR_S3_ENDPOINT_URL or AWS_ENDPOINT_URL for MinIO/moto).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Paths:
    home: Path

    @property
    def prefect_home(self) -> Path:
        return self.home / "prefect"

    @property
    def mlflow_dir(self) -> Path:
        return self.home / "mlflow"

    @property
    def mlflow_db(self) -> Path:
        return self.mlflow_dir / "mlflow.db"

    @property
    def mlflow_artifacts(self) -> Path:
        return self.mlflow_dir / "artifacts"

    @property
    def artifacts(self) -> Path:
        return self.home / "artifacts"

    @property
    def cache(self) -> Path:
        return self.home / "cache"

    @property
    def warehouse(self) -> Path:
        return self.home / "warehouse.duckdb"

    @property
    def torch_extensions(self) -> Path:
        return self.home / "torch_extensions"


def rlvr_home() -> Path:
    return Path(os.environ.get("RLVR_HOME", ".rlvr")).expanduser().resolve()


def paths() -> Paths:
    return Paths(rlvr_home())


def mlflow_tracking_uri(configured: str | None = None) -> str:
    """Config value, else MLFLOW_TRACKING_URI, else the embedded sqlite store."""
    return configured or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{paths().mlflow_db}"


def artifact_uri(configured: str | None = None) -> str:
    return configured or os.environ.get("RLVR_ARTIFACT_URI") or str(paths().artifacts)


def s3_endpoint_url(configured: str | None = None) -> str | None:
    return configured or os.environ.get("RLVR_S3_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL") or None


def system_metrics_enabled() -> bool:
    """MLflow system metrics (CPU, memory, GPU) on pipeline runs: on unless RLVR_SYSTEM_METRICS=0."""
    return os.environ.get("RLVR_SYSTEM_METRICS", "1").strip().lower() not in ("0", "false", "no", "off")


def warehouse_path() -> Path:
    return Path(os.environ.get("RLVR_WAREHOUSE", str(paths().warehouse))).expanduser().resolve()


def configure_environment() -> Paths:
    """Set the process environment for the embedded stack. Call before importing prefect.

    Prefect reads its settings at import time, so PREFECT_HOME must be in the environment first.
    A user's own PREFECT_API_URL / PREFECT_HOME are respected (real server by configuration only).
    """
    p = paths()
    for d in (p.home, p.prefect_home, p.mlflow_dir, p.mlflow_artifacts, p.artifacts, p.cache):
        d.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PREFECT_HOME", str(p.prefect_home))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # Ephemeral server start-up can take >10 s on a busy 2-core machine; Prefect's default is tighter.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    # MLflow's *fluent* system-metrics switch stays off: our runs are client runs, whose system metrics
    # `Tracker.system_metrics` starts explicitly (RLVR_SYSTEM_METRICS=0 turns those off). Git probing is noise.
    os.environ.setdefault("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "false")
    os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(p.torch_extensions))
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return p
