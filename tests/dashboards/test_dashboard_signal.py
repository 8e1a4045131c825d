"""`rlvr dashboard` as a real process: `kill -TERM` of the command stops the Streamlit server it started
(before the fix, the server kept running and kept the port)."""

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


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_to_the_dashboard_command_stops_streamlit(sample_warehouse, tmp_path, sig):
    port = free_port()
    env = {**os.environ, "RLVR_HOME": str(tmp_path / "home")}
    cmd = [sys.executable, "-m", "rlvr_cli.main", "dashboard", "--port", str(port), "--warehouse", str(sample_warehouse.db)]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    children: list[psutil.Process] = []
    try:
        wait_http(f"http://127.0.0.1:{port}/_stcore/health", proc, timeout_s=120)
        children = psutil.Process(proc.pid).children(recursive=True)
        assert any("streamlit" in " ".join(c.cmdline()) for c in children), [c.cmdline() for c in children]
        proc.send_signal(sig)
        proc.wait(timeout=30)
        _, alive = psutil.wait_procs(children, timeout=30)
        assert alive == [], f"still running after {sig.name} to rlvr dashboard: {[c.pid for c in alive]}"
        assert _port_free(port)
    finally:
        for p in [*children, psutil.Process(proc.pid) if proc.poll() is None else None]:
            if p is not None and p.is_running():
                p.kill()
