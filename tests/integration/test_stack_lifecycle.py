"""The whole local stack as a user runs it: `rlvr stack up` (S3 on disk, MLflow server, PostgreSQL, Prefect
server, pools, workers, deployments), left alone, stopped and started again.

1. Schedules fire: with `--nightly-cron '* * * * *'` the Prefect server itself creates runs of
   `nightly-eval/nightly` and a worker executes one to Completed (in seconds: nothing to evaluate); nobody asks
   for a run, and never more than one is Pending or Running (the deployment's concurrency limit). Meanwhile the
   server's log stays free of errors (SQLAlchemy 2.1 broke the scheduler; SQLite gave "database is locked").
   The schedule is the user's: `up --nightly-cron` on the running stack changes it, a plain `up` keeps it.
2. `down` then `up` at once, three times, on the same ports (the servers' TIME_WAIT sockets do not block
   them), and the data is kept: an MLflow run with artifacts, a checkpoint folder (with a multipart-sized
   file) and a report in the artifact store, Prefect's flow runs and the nightly schedule are all there. Only
   `down --delete-data` removes them.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from datetime import datetime
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.integration.conftest import stack_cmd

pytestmark = [pytest.mark.slow, pytest.mark.s3]

UP = ["up", "--mlflow-port", "0", "--s3-port", "0", "--prefect-port", "0", "--pg-port", "0", "--json"]


def _up(home: Path, *extra: str) -> dict:
    proc = stack_cmd(home, *UP, *extra, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _api(state: dict, path: str, body: dict | None = None):
    req = urllib.request.Request(state["prefect"]["api_url"] + path, data=json.dumps(body or {}).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def _nightly_runs(state: dict) -> list[dict]:
    deps = _api(state, "/deployments/filter", {"deployments": {"name": {"any_": ["nightly"]}}})
    assert len(deps) == 1, deps
    return _api(state, "/flow_runs/filter", {"flow_runs": {"deployment_id": {"any_": [deps[0]["id"]]}},
                                             "limit": 200})


def _seconds(start: str, end: str) -> float:
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    home = tmp_path_factory.mktemp("lifecycle")
    state = _up(home, "--nightly-cron", "* * * * *")
    try:
        yield home, state
    finally:
        stack_cmd(home, "down")


def test_the_server_schedules_the_nightly_run_and_a_worker_runs_it(stack):
    home, state = stack
    assert state["prefect"]["database"] == "postgresql" and state["prefect"]["nightly_cron"] == "* * * * *"
    dep = _api(state, "/deployments/filter", {"deployments": {"name": {"any_": ["nightly"]}}})[0]
    limit, options = dep["global_concurrency_limit"], dep["concurrency_options"]
    assert limit["limit"] == 1 and options["collision_strategy"] == "CANCEL_NEW", (limit, options)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        runs = _nightly_runs(state)
        assert sum(r["state_type"] in ("PENDING", "RUNNING") for r in runs) <= 1, [r["state_type"] for r in runs]
        done = [r for r in runs if r["state_type"] == "COMPLETED"]
        if done:
            break
        time.sleep(2)
    assert done, f"no scheduled nightly run completed in 4 min; states: {[r['state_type'] for r in runs]}"
    # An empty store: nothing new, so the run ends in seconds.
    took = [_seconds(r["start_time"], r["end_time"]) for r in done]
    assert max(took) < 30, took
    assert all(r["auto_scheduled"] for r in runs)  # the scheduler made every one of them, not this test
    assert any(r["state_type"] == "SCHEDULED" for r in runs)  # and keeps the next ones queued
    log = (home / "logs" / "prefect-server.log").read_text(errors="replace")
    bad = [line for line in log.splitlines() if "Traceback" in line or "| ERROR" in line or "locked" in line]
    assert not bad, "\n".join(bad[:20])


def _nightly_deployment(state: dict) -> dict:
    return _api(state, "/deployments/filter", {"deployments": {"name": {"any_": ["nightly"]}}})[0]


def test_the_nightly_schedule_is_the_users_on_a_running_stack(stack):
    """`up --nightly-cron` on the running stack changes the deployment's schedule (the old cron's scheduled runs
    go), a plain `up` keeps it, `up` and `stack env` print it, a bad cron is refused in one line. The module's
    per-minute cron is set back at the end (the restart test needs it)."""
    home, state = stack
    env = stack_cmd(home, "env")
    assert env.returncode == 0 and "nightly-eval schedule: cron '* * * * *' UTC" in env.stderr, env.stderr
    try:
        changed = _up(home, "--nightly-cron", "17 4 * * *")
        assert changed["already_running"] and changed["prefect"]["nightly_cron"] == "17 4 * * *", changed["prefect"]
        [sch] = _nightly_deployment(state)["schedules"]
        assert sch["schedule"]["cron"] == "17 4 * * *" and sch["schedule"]["timezone"] == "UTC", sch
        for r in _nightly_runs(state):  # what the per-minute cron had scheduled is gone
            if r["state_type"] == "SCHEDULED":
                t = datetime.fromisoformat(r["expected_start_time"])
                assert (t.hour, t.minute) == (4, 17), r["expected_start_time"]
        plain = stack_cmd(home, "up")  # a plain `up`: already running, the schedule kept and printed
        assert plain.returncode == 0 and "stack already running" in plain.stderr, plain.stderr
        assert "nightly-eval cron '17 4 * * *' UTC" in plain.stderr, plain.stderr
        assert "nightly-eval schedule: cron '17 4 * * *' UTC" in stack_cmd(home, "env").stderr
        bad = stack_cmd(home, "up", "--nightly-cron", "every night")
        assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
            "--nightly-cron 'every night': not a cron expression (five fields, UTC, e.g. '0 3 * * *')"], bad.stderr
    finally:
        back = _up(home, "--nightly-cron", "* * * * *")
    assert back["prefect"]["nightly_cron"] == "* * * * *"
    assert _nightly_deployment(state)["schedules"][0]["schedule"]["cron"] == "* * * * *"


def _point_at(state: dict, monkeypatch) -> dict:
    for k, v in state["env"].items():
        monkeypatch.setenv(k, v)
    return state["env"]


def _write_everything(state: dict, tmp: Path, monkeypatch) -> dict:
    """An MLflow run with an artifact, a checkpoint folder and a report in the artifact store."""
    import mlflow

    from rlvr_core.artifacts.storage import open_store

    env = _point_at(state, monkeypatch)
    client = mlflow.MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    exp = client.create_experiment("restart-check")
    run = client.create_run(exp, run_name="kept")
    (tmp / "notes.txt").write_text("trained for 3 steps\n")
    client.log_artifact(run.info.run_id, str(tmp / "notes.txt"), "summary")
    client.log_metric(run.info.run_id, "reward", 0.5, step=3)
    client.set_terminated(run.info.run_id)

    ckpt = tmp / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(os.urandom(9 * 1024 * 1024))  # over boto3's multipart threshold
    (ckpt / "config.json").write_text('{"hidden_size": 32}')
    store = open_store(env["RLVR_ARTIFACT_URI"], env["RLVR_S3_ENDPOINT_URL"])
    store.put_dir("restart-check/kept/checkpoints/final", ckpt)
    (tmp / "report.html").write_text("<html><body>report</body></html>")
    store.put_file("restart-check/kept/report.html", tmp / "report.html")
    return {"run_id": run.info.run_id, "ckpt": ckpt, "report": tmp / "report.html"}


def _read_everything(state: dict, written: dict, tmp: Path, monkeypatch) -> None:
    import mlflow

    from rlvr_core.artifacts.storage import open_store

    env = _point_at(state, monkeypatch)
    tmp.mkdir()
    client = mlflow.MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    run = client.get_run(written["run_id"])
    assert run.data.metrics["reward"] == 0.5 and run.info.status == "FINISHED"
    got = client.download_artifacts(written["run_id"], "summary/notes.txt", str(tmp))
    assert Path(got).read_text() == "trained for 3 steps\n"
    store = open_store(env["RLVR_ARTIFACT_URI"], env["RLVR_S3_ENDPOINT_URL"])
    for f in written["ckpt"].iterdir():
        store.get_file(f"restart-check/kept/checkpoints/final/{f.name}", tmp / f.name)
        assert (tmp / f.name).read_bytes() == f.read_bytes(), f.name
    store.get_file("restart-check/kept/report.html", tmp / "r.html")
    assert (tmp / "r.html").read_bytes() == written["report"].read_bytes()


def _same_ports(state: dict) -> list[str]:
    """The ports `rlvr stack env` exported, as `up` options: a restart must come back on them."""
    def port(url: str) -> str:
        return urlsplit(url).netloc.rsplit(":", 1)[1]

    return ["--mlflow-port", port(state["mlflow"]["url"]), "--s3-port", port(state["s3"]["url"]),
            "--prefect-port", port(state["prefect"]["api_url"]), "--pg-port", str(state["postgres"]["port"])]


def _time_wait_on(ports: list[str]) -> set[int]:
    """Those of the ports that hold a socket in TIME_WAIT (left by the servers `down` just stopped)."""
    import psutil

    wanted = {int(p) for p in ports[1::2]}
    return {c.laddr.port for c in psutil.net_connections(kind="tcp")
            if c.status == psutil.CONN_TIME_WAIT and c.laddr and c.laddr.port in wanted}


def test_down_then_up_at_once_on_the_same_ports_keeps_every_artifact_run_and_flow_run(stack, tmp_path, monkeypatch):
    """Three times `down` then `up` at once, with the ports of the first `up`: the servers' TIME_WAIT
    sockets (every HTTP request leaves one on the server's port for a minute) must not block the restart,
    and the URLs `rlvr stack env` exported stay valid. The data is all there after the restarts."""
    home, state = stack
    written = _write_everything(state, tmp_path, monkeypatch)
    before = {r["id"] for r in _nightly_runs(state) if r["state_type"] == "COMPLETED"}
    ports, env, waited = _same_ports(state), state["env"], set()
    try:
        for i in range(3):
            down = stack_cmd(home, "down")
            assert down.returncode == 0 and "data kept" in down.stderr, down.stderr
            waited |= _time_wait_on(ports)
            t0 = time.monotonic()
            # A plain `up` keeps the deployed schedule (nothing to deploy again); the last one names it again.
            state = _up(home, *ports, *(["--nightly-cron", "* * * * *"] if i == 2 else []))
            print(f"restart {i + 1}: up took {time.monotonic() - t0:.1f} s")
            assert state["prefect"]["nightly_cron"] == "* * * * *", state["prefect"]
            assert state["env"] == env, (state["env"], env)  # the same URLs: clients need not re-read `stack env`
        assert waited, "no TIME_WAIT socket on the stack's ports at any restart: the test did not test it"
        _read_everything(state, written, tmp_path / "after", monkeypatch)
        assert before and before <= {r["id"] for r in _nightly_runs(state)}  # Prefect's history is in PostgreSQL
        # The restarts kept the setup and deployments (nothing they depend on changed) and the stack still works:
        # a nightly run the scheduler made after the last restart is picked up and completed by a new worker.
        assert state["prefect"]["deployments"] == "kept", state["prefect"]
        restarted, deadline, after = time.time(), time.monotonic() + 240, []
        while not after and time.monotonic() < deadline:
            time.sleep(2)
            after = [r for r in _nightly_runs(state) if r["state_type"] == "COMPLETED" and r["id"] not in before
                     and datetime.fromisoformat(r["end_time"]).timestamp() > restarted - 5]
        assert after, [(r["state_type"], r["state_name"], r["expected_start_time"], r["end_time"])
                       for r in _nightly_runs(state) if r["id"] not in before][-12:]
    finally:
        gone = stack_cmd(home, "down", "--delete-data")
    assert gone.returncode == 0, gone.stderr
    for data in ("s3", "postgres", "mlflow.db"):
        assert not (home / "stack" / data).exists(), data
