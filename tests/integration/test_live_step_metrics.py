"""Per-step training metrics while MLflow is unreachable (rlvr_core.records.tracking.StepMetricsSink): the trainer
is never held up, the failure is warned once, nothing is lost and nothing is sent twice once a real
`mlflow server` answers again."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from rlvr_core.records.tracking import StepMetricsSink, Tracker
from rlvr_core.core.net import free_port
from tests.mlflow_server import server_env

pytestmark = pytest.mark.slow


def _serve(db: Path, port: int, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1", "--backend-store-uri", f"sqlite:///{db}",
                             "--default-artifact-root", str(db.parent / "artifacts")],
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True,
                            env=server_env())
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200:
                return proc
        except OSError:
            time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    pytest.fail("mlflow server did not start")


def _steps(client, run: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run, "train/loss"))


def test_unreachable_mlflow_keeps_training_and_loses_nothing(rlvr_home, monkeypatch, caplog):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # fail fast; the sink does the retrying
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "3")
    rlvr_home.mkdir(parents=True, exist_ok=True)
    db = rlvr_home / "mlflow.db"
    local = Tracker("live", tracking_uri=f"sqlite:///{db}")  # the run exists; its server is down
    run = local.start_run("train", {})
    port = free_port()
    caplog.set_level(logging.WARNING, logger="rlvr.tracking")
    sink = StepMetricsSink(run, f"http://rlvr:hunter2@127.0.0.1:{port}", every_steps=1, every_s=0.3)
    for step in (1, 2, 3):
        t0 = time.perf_counter()
        sink({"step": step, "loss": float(step)})
        assert time.perf_counter() - t0 < 0.05  # training does not wait for a dead server
        time.sleep(0.4)
    assert _steps(local.client, run) == []
    unreachable = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(unreachable) == 1 and "hunter2" not in caplog.text  # warned once, no credential in it
    proc = _serve(db, port, rlvr_home / "mlflow-server.log")
    try:
        for step in (4, 5):
            sink({"step": step, "loss": float(step)})
            time.sleep(0.01)
        sink.close()
        assert _steps(local.client, run) == [1, 2, 3, 4, 5]  # buffered steps arrived, each once
        assert sink.sent == 5 and not sink._pending
        assert len([r for r in caplog.records if "unreachable" in r.getMessage()]) == 1
        assert any("reachable again" in r.getMessage() for r in caplog.records)
        hist = sorted(local.client.get_metric_history(run, "train/loss"), key=lambda m: m.step)
        assert len({m.timestamp for m in hist}) == 5  # the times the steps finished, not the time of sending
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_what_never_arrives_is_warned_with_its_count(rlvr_home, monkeypatch, caplog):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "3")
    caplog.set_level(logging.WARNING, logger="rlvr.tracking")
    sink = StepMetricsSink("0123456789abcdef", f"http://127.0.0.1:{free_port()}", every_s=0.2, close_timeout_s=20)
    for step in (1, 2):
        sink({"step": step, "loss": 1.0, "reward_mean": 0.5})
    sink.close()
    assert "4 per-step metric values (2 steps) did not reach MLflow run 0123456789abcdef" in caplog.text
