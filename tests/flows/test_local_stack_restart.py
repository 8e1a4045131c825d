"""`prefect_up` on a restart: the setup and `prefect deploy` (10-20 s of `rlvr stack up`) are skipped only when the
server's database already holds what they would make (flows/local_stack.py), against a real Prefect API."""

from __future__ import annotations

import time
from pathlib import Path

from flows import local_stack as ls


def test_deploy_fingerprint_kept_on_the_server_and_what_changes_it(prefect_api, tmp_path):
    from prefect.settings import PREFECT_API_URL

    api = PREFECT_API_URL.value().rstrip("/")
    env = ls.stack_env(tmp_path, api)
    fp = ls.deploy_fingerprint(env, gpu_slots=2)
    assert ls._server_variable(api) is None  # a fresh database: set up and deploy
    ls._set_server_variable(api, fp)
    assert ls._server_variable(api) == fp
    ls._set_server_variable(api, "other")  # a second deploy on the same database updates it
    assert ls._server_variable(api) == "other"
    # What the deployments are made of changes the fingerprint: the schedule, the GPU slots, the checkout.
    assert ls.deploy_fingerprint(env, gpu_slots=2) == fp
    assert ls.deploy_fingerprint({**env, "RLVR_NIGHTLY_CRON": "0 * * * *"}, gpu_slots=2) != fp
    assert ls.deploy_fingerprint(env, gpu_slots=1) != fp
    assert ls.deploy_fingerprint({**env, "RLVR_PROJECT_ROOT": "/elsewhere"}, gpu_slots=2) != fp
    # The fingerprint alone is not enough: the deployments of prefect.yaml must be there (none on this server).
    assert ls._deployments_there(api) is False


def test_stopping_several_processes_asks_them_all_at_once_then_kills_what_stays(tmp_path):
    # `prefect_down` stops the workers together: the wait is the slowest one's grace period, not the sum of
    # them (a worker that stalls its shutdown for the whole grace period made the stack's teardown take 50 s).
    import subprocess
    import sys

    stubborn = ("import signal, sys, time\n"
                "def note(*_):\n"
                "    open(sys.argv[1], 'a').write(repr(time.time()) + '\\n')\n"
                "signal.signal(signal.SIGTERM, note)\n"
                "open(sys.argv[1] + '.up', 'w').close()\n"
                "while True: time.sleep(0.05)\n")
    marks = [tmp_path / f"p{i}" for i in range(2)]
    procs = [subprocess.Popen([sys.executable, "-c", stubborn, str(m)], start_new_session=True) for m in marks]
    for m in marks:
        for _ in range(400):
            if Path(str(m) + ".up").exists():
                break
            time.sleep(0.05)
    ls.stop_pids([p.pid for p in procs], timeout_s=2.0)
    assert not any(ls._alive(p.pid) for p in procs)  # SIGTERM was noted, not obeyed: SIGKILL ended both
    asked = [float(m.read_text().split()[0]) for m in marks]
    assert abs(asked[0] - asked[1]) < 1.0, asked  # one after the other would be >= the 2 s grace apart


def test_the_lost_worker_wait_comes_from_the_environment_and_replaces_the_automation(prefect_api, monkeypatch):
    # RLVR_LOST_AFTER_S sets the automation's wait; setting the stack up again with another value replaces the
    # automation (a kept one would silently go on with the old wait), and changes the deploy fingerprint.
    from datetime import timedelta

    import pytest
    from prefect.automations import Automation

    env = ls.stack_env(Path("/tmp/unused"), "http://127.0.0.1:1/api")
    monkeypatch.delenv("RLVR_LOST_AFTER_S", raising=False)
    assert ls.lost_after_s() == ls.LOST_AFTER_S == 120
    default_fp = ls.deploy_fingerprint(env, gpu_slots=2)
    for wait in (90, 150):
        monkeypatch.setenv("RLVR_LOST_AFTER_S", str(wait))
        ls._setup(gpu_slots=2)
        automation = Automation.read(name="rlvr-crash-lost-flow-runs")
        assert automation.trigger.within == timedelta(seconds=wait)
        assert automation.actions[0].message == f"no heartbeat for {wait} s: its worker was lost"
    assert ls.deploy_fingerprint(env, gpu_slots=2) != default_fp
    for wait in (30, 89):  # under a heartbeat interval plus a server stall: a healthy run's late heartbeat crashes it
        monkeypatch.setenv("RLVR_LOST_AFTER_S", str(wait))
        with pytest.raises(ValueError, match=f"RLVR_LOST_AFTER_S={wait}: must be at least 90 s"):
            ls.lost_after_s()


def test_runs_left_pending_by_a_stopped_stack_are_crashed_at_the_next_start(prefect_api):
    # A worker stopped while it submitted a run leaves it Pending for good (no heartbeat, so the lost-worker
    # automation never sees it), holding the nightly deployment's only concurrency slot; `prefect_up` marks
    # such runs Crashed before its workers start. Runs in other states and other pools are left alone.
    import uuid

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.settings import PREFECT_API_URL
    from prefect.states import Pending, Scheduled

    api = PREFECT_API_URL.value().rstrip("/")
    runs = {}
    with get_client(sync_client=True) as client:
        flow_id = client.create_flow_from_name(f"orphans-{uuid.uuid4().hex[:6]}")
        for pool in (ls.GPU_POOL, "someone-elses-pool"):
            try:
                client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
            except Exception:  # noqa: BLE001 - made by an earlier test of this session
                pass
            dep = client.create_deployment(flow_id=flow_id, name=f"d-{pool}-{uuid.uuid4().hex[:6]}", work_pool_name=pool)
            for kind, state in (("pending", Pending()), ("scheduled", Scheduled())):
                run = client.create_flow_run_from_deployment(dep, state=state)
                runs[(pool, kind)] = run.id
        assert ls.crash_orphaned_runs(api) >= 1
        states = {k: client.read_flow_run(v).state.type.value for k, v in runs.items()}
    assert states == {(ls.GPU_POOL, "pending"): "CRASHED", (ls.GPU_POOL, "scheduled"): "SCHEDULED",
                      ("someone-elses-pool", "pending"): "PENDING", ("someone-elses-pool", "scheduled"): "SCHEDULED"}
