"""The retry policy on real exception types, a real stage subprocess, and real Prefect retries."""

from __future__ import annotations

import errno
import json
import signal
import socket
import subprocess
import sys

import pytest

from rlvr_core.experiment.config import ConfigError
from tasks.retry import StageProcessError, is_transient, killed_by_signal


def _s3_client_error(code: str, status: int):
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": "x"}, "ResponseMetadata": {"HTTPStatusCode": status}},
                       "PutObject")


def test_transient_failures_are_retried():
    from botocore.exceptions import EndpointConnectionError

    for exc in (ConnectionResetError(errno.ECONNRESET, "reset"), BrokenPipeError(), TimeoutError("lock"),
                socket.timeout("read"), EndpointConnectionError(endpoint_url="http://127.0.0.1:1"),
                _s3_client_error("SlowDown", 503), _s3_client_error("InternalError", 500),
                RuntimeError("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4)"),
                StageProcessError("killed", transient=True, returncode=-9)):
        assert is_transient(exc), repr(exc)


def test_deterministic_failures_are_not_retried():
    import torch

    from rlvr_core.grpo.trainer import GuardError

    for exc in (ConfigError("c.yaml", [("grpo.lr", "bad")]), GuardError("G-logprob-temp"), ValueError("bad"),
                KeyError("answer"), TypeError("verifier bug"), FileNotFoundError("x"),
                torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                RuntimeError("CUDA error: out of memory"), MemoryError(), _s3_client_error("AccessDenied", 403),
                _s3_client_error("NoSuchBucket", 404), RuntimeError("something we have never seen"),
                StageProcessError("bad config", transient=False, returncode=1)):
        assert not is_transient(exc), repr(exc)


def test_killed_by_signal_from_a_real_process():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    p.send_signal(signal.SIGKILL)
    assert killed_by_signal(p.wait()) and not killed_by_signal(0) and not killed_by_signal(1)
    assert killed_by_signal(137) and killed_by_signal(143)


def test_stage_process_reports_a_deterministic_failure(tmp_path, rlvr_home):
    """A bad config inside the child comes back as a StageProcessError the policy does not retry."""
    from tasks.stage_process import run_stage_process

    with pytest.raises(StageProcessError) as e:
        run_stage_process("train", {"config": {"grpo": {"bogus": 1}}, "source": "trial.yaml"})
    assert e.value.transient is False and e.value.error_type.endswith("ConfigError")
    assert "trial.yaml: grpo.bogus: unknown key" in str(e.value)


@pytest.mark.slow
def test_prefect_retries_transient_and_not_deterministic(prefect_api, rlvr_home):
    """Real Prefect (temporary server): the condition decides, attempts are counted."""
    from prefect import flow, task

    from tasks.retry import retry_condition_fn

    calls = {"flaky": 0, "broken": 0}

    @task(retries=3, retry_delay_seconds=0, retry_condition_fn=retry_condition_fn)
    def flaky() -> str:
        calls["flaky"] += 1
        if calls["flaky"] < 3:
            raise ConnectionResetError(errno.ECONNRESET, "S3 connection reset")
        return "ok"

    @task(retries=3, retry_delay_seconds=0, retry_condition_fn=retry_condition_fn)
    def broken() -> None:
        calls["broken"] += 1
        raise KeyError("answer")  # a verifier bug: would fail again

    @flow
    def f() -> str:
        out = flaky()
        broken()
        return out

    with pytest.raises(KeyError):
        f()
    assert calls == {"flaky": 3, "broken": 1}
