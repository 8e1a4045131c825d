"""A real MLflow tracking server for tests: `mlflow server` on 127.0.0.1 over a sqlite file in `home`, started as
`rlvr stack up` starts it (`python -m rlvr_core.records.mlflow_ui server`: its UI opens in the model-training view)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest


def server_env() -> dict[str, str]:
    """The environment of a test's `mlflow server`: as `rlvr stack up` starts it (rlvr_core/pipeline/stack.py),
    without MLflow's job runner. That runner is five polling queue consumers that nothing here uses; left on,
    one idle server took 18 CPU-seconds a minute (30 % of a core) from the tests running beside it."""
    return {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def start_mlflow(home: Path) -> dict:
    """Start the server; {"url": "http://127.0.0.1:PORT", "pid": ...}. Stop it with `flows.local_stack.stop_pid`."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (home / "mlflow").mkdir(parents=True, exist_ok=True)
    log = open(home / "mlflow-server.log", "ab")
    proc = subprocess.Popen([os.sys.executable, "-m", "rlvr_core.records.mlflow_ui", "server", "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1",
                             "--backend-store-uri", f"sqlite:///{home / 'mlflow' / 'mlflow.db'}",
                             "--default-artifact-root", str(home / "mlflow" / "artifacts")],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=server_env())
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert proc.poll() is None, (home / "mlflow-server.log").read_text()[-3000:]
        try:
            if urllib.request.urlopen(url + "/health", timeout=2).status == 200:
                return {"url": url, "pid": proc.pid}
        except OSError:
            time.sleep(0.5)
    proc.kill()
    pytest.fail("mlflow server did not start")


def table_roots(runs) -> list[str]:
    """The names of the runs MLflow 3.17's runs table draws at its top level, ordered by "Created" (its default
    order; any other order or a search filter lists every run flat): a run is folded under its
    `mlflow.parentRunId` when that run is among the loaded ones, at any depth (the UI's
    experimentPage.row-utils). `runs`: what the page loaded (its search's runs, up to 100 a page, plus their
    direct parents)."""
    ids = {r.info.run_id for r in runs}
    return [r.info.run_name for r in runs if r.data.tags.get("mlflow.parentRunId") not in ids]
