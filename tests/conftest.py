"""Shared fixtures: an isolated RLVR_HOME per test, and a real S3 API (moto_server on 127.0.0.1)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def pytest_runtest_setup(item):
    """Tests marked `shared_data` read real benchmark files that are not part of the repository: a clone
    without them skips those tests and says where it looked, instead of failing on a missing file."""
    if item.get_closest_marker("shared_data"):
        from rlvr_core.experiment.benchmarks import data_root

        root = data_root()
        if not root.is_dir():
            pytest.skip(f"shared data not found at {root} (set RLVR_DATA_DIR)")


@pytest.fixture
def rlvr_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "rlvr-home"
    monkeypatch.setenv("RLVR_HOME", str(home))
    for var in ("MLFLOW_TRACKING_URI", "RLVR_ARTIFACT_URI", "RLVR_WAREHOUSE", "RLVR_S3_ENDPOINT_URL"):
        monkeypatch.delenv(var, raising=False)
    return home


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def moto_endpoint():
    """A moto_server process serving the S3 API over HTTP on loopback, for the whole session."""
    exe = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or shutil.which("moto_server")
    if exe is None:
        pytest.fail("moto_server not installed (pip install 'moto[server]'); S3 tests need a real S3 API")
    port = _free_port()
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            if proc.poll() is not None:
                pytest.fail("moto_server exited at start-up")
            time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("moto_server did not start within 60 s")
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture
def s3_env(moto_endpoint, monkeypatch):
    """Dummy credentials for moto; returns (endpoint_url, fresh bucket name)."""
    import uuid

    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    bucket = f"rlvr-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_endpoint).create_bucket(Bucket=bucket)
    return moto_endpoint, bucket
