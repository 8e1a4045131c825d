"""`rlvr stack` bookkeeping without starting the services: the state file, pid identity, ports.
(The full up → use → down cycle runs in test_mlflow_server_s3.py.)"""

from __future__ import annotations

import json
import signal
import socket
import subprocess

import pytest

from rlvr_core.pipeline import stack


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "60"], start_new_session=True)


def test_no_stack_recorded(rlvr_home):
    assert stack.status() == {"running": False, "components": {}}
    assert stack.down() == {}


def test_down_signals_only_the_recorded_process(rlvr_home):
    """A pid whose start time differs from the recorded one is someone else's process: never signalled."""
    ours, stranger = _sleeper(), _sleeper()
    try:
        real = {"pid": ours.pid, "create_time": stack._create_time(ours.pid), "log": "x", "url": "http://127.0.0.1:1"}
        recycled = {"pid": stranger.pid, "create_time": stack._create_time(stranger.pid) - 1000.0, "log": "x",
                    "url": "http://127.0.0.1:2"}
        stack._write_state({"home": str(rlvr_home), "mlflow": real, "s3": recycled, "prefect": {"skipped": "test"}})
        st = stack.status()
        assert st["components"]["mlflow"]["alive"] and not st["components"]["mlflow"]["healthy"]
        assert st["components"]["s3"]["alive"] is False and st["running"] is False
        assert stack.down() == {"mlflow": "stopped", "s3": "not running"}
        assert ours.wait(timeout=10) == -signal.SIGTERM
        assert stranger.poll() is None  # untouched
        assert not stack.state_path().exists()
    finally:
        for p in (ours, stranger):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_state_file_is_private_and_holds_no_real_credentials(rlvr_home, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "real-secret-from-the-user")
    state = {"home": str(rlvr_home), "mlflow": {"url": "http://127.0.0.1:5000"}, "s3": {"url": "http://127.0.0.1:9000"}}
    env = stack.exports(state)
    assert env["AWS_SECRET_ACCESS_KEY"] == stack.LOCAL_S3_SECRET and env["RLVR_ARTIFACT_URI"] == "s3://rlvr/artifacts"
    stack._write_state({**state, "env": env})
    assert stack.state_path().stat().st_mode & 0o777 == 0o600
    assert "real-secret-from-the-user" not in stack.state_path().read_text()
    assert json.loads(stack.state_path().read_text())["env"]["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:5000"


def test_a_busy_port_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(stack.StackError, match=f"port {port} on 127.0.0.1 is in use; pass --mlflow-port 0"):
            stack._port(port, "mlflow server", "--mlflow-port")
    assert stack._port(0, "x", "--x") > 0


def test_corrupt_state_file_names_the_file(rlvr_home):
    stack.state_path().parent.mkdir(parents=True)
    stack.state_path().write_text("{not json")
    with pytest.raises(stack.StackError, match="state.json: not valid JSON"):
        stack.status()
