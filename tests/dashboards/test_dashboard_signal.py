"""`rlvr dashboard` as a real process: `kill -TERM` (or a hang-up) of the command stops the Streamlit server it
started, and frees the port; under `nohup` (SIGHUP ignored) a hang-up leaves both running, as nohup promises.

The command is started with the signal dispositions a shell gives it (SIGHUP at its default), whatever the
test runner inherited: a suite launched under nohup would otherwise pass SIGHUP's "ignore" down to it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import psutil
import pytest
from browser import ROOT, free_port, wait_http


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def _start_dashboard(db, tmp_path, sighup) -> tuple[subprocess.Popen, int, list[psutil.Process]]:
    port = free_port()
    env = {**os.environ, "RLVR_HOME": str(tmp_path / "home")}
    cmd = [sys.executable, "-m", "rlvr_cli.main", "dashboard", "--port", str(port), "--warehouse", str(db)]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, sighup))
    wait_http(f"http://127.0.0.1:{port}/_stcore/health", proc, timeout_s=120)
    children = psutil.Process(proc.pid).children(recursive=True)
    assert any("streamlit" in " ".join(c.cmdline()) for c in children), [c.cmdline() for c in children]
    return proc, port, children


def _kill_all(proc: subprocess.Popen, children: list[psutil.Process]) -> None:
    for p in [*children, psutil.Process(proc.pid) if proc.poll() is None else None]:
        if p is not None and p.is_running():
            p.kill()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_to_the_dashboard_command_stops_streamlit(sample_warehouse, tmp_path, sig):
    proc, children = None, []
    try:
        proc, port, children = _start_dashboard(sample_warehouse.db, tmp_path, signal.SIG_DFL)
        proc.send_signal(sig)
        proc.wait(timeout=30)
        _, alive = psutil.wait_procs(children, timeout=30)
        assert alive == [], f"still running after {sig.name} to rlvr dashboard: {[c.pid for c in alive]}"
        assert _port_free(port)
    finally:
        if proc is not None:
            _kill_all(proc, children)


def test_under_nohup_a_hang_up_leaves_the_dashboard_running(sample_warehouse, tmp_path):
    proc, children = None, []
    try:
        proc, port, children = _start_dashboard(sample_warehouse.db, tmp_path, signal.SIG_IGN)
        proc.send_signal(signal.SIGHUP)
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=3)
        assert all(c.is_running() for c in children) and not _port_free(port)
        proc.send_signal(signal.SIGTERM)  # ... and it still stops when asked to
        proc.wait(timeout=30)
        _, alive = psutil.wait_procs(children, timeout=30)
        assert alive == []
    finally:
        if proc is not None:
            _kill_all(proc, children)
