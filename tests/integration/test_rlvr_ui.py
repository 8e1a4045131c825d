"""`rlvr ui`: MLflow's UI over this project's embedded store, as the stack serves it (its page stores the
model-training view as the browser's default: rlvr_core/records/mlflow_ui.py); stopping the command stops it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

from rlvr_core.core.net import free_port
from rlvr_core.records.mlflow_ui import SCRIPT


def test_rlvr_ui_serves_the_embedded_store_in_the_model_training_view(rlvr_home):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    proc = subprocess.Popen([sys.executable, "-c", "from rlvr_cli.main import app; app()", "ui", "--port", str(port)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline, page = time.monotonic() + 120, b""
        while time.monotonic() < deadline and not page:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            try:
                page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).read()
            except OSError:
                time.sleep(0.5)
        assert SCRIPT.encode() in page, page[:300]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert f"MLflow UI on http://127.0.0.1:{port}/#/experiments?workflowType=machine_learning" in err, err
        assert f"sqlite:///{rlvr_home}" in err, err  # the project's own store
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    time.sleep(1)
    try:  # the server went with the command
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
        raise AssertionError("the MLflow server outlived `rlvr ui`")
    except OSError:
        pass
