"""A real Prefect stack on a laptop: server on 127.0.0.1, process work pools, workers, deployed flows.

`prefect_up(home)` starts, in this order:
  1. `prefect server start --host 127.0.0.1 --port <port>` on the PostgreSQL database `database_url`
     (what `rlvr stack up` gives it), else on SQLite under `home/prefect-server` (enough for a test's
     short life; under a long-running server its scheduler and workers get "database is locked");
  2. two process work pools from `infra/prefect/process-base-job-template.json`: `rlvr-gpu` (pipeline
     trials, nightly evaluations: the GPU stages) and `rlvr-cpu` (the sweep driver, which only waits on
     its trials, so losing a GPU worker never takes the sweep down with it);
  3. a `gpu` tag concurrency limit (the slots GPU tasks take) and the automation that marks a flow run
     Crashed when its heartbeats stop (a lost worker), so the sweep can launch it again;
  4. the deployments of `infra/prefect/prefect.yaml` (`prefect deploy --all`);
  5. one worker per pool.
Steps 2-4 are skipped on a restart on the same database when nothing they depend on changed
(`deploy_fingerprint`, kept on the server as the variable `rlvr_stack_deployed`): they cost 10-20 s of start-up.
It returns a JSON-able state dict; `prefect_down(state)` stops everything by pid (workers before the
server: a worker whose server is gone ignores SIGINT, STACK.md). `rlvr stack up/down` calls these;
`python -m flows.local_stack up|down --home DIR` does the same from a shell.

The workers run flows in the project checkout with `RLVR_HOME=home`, so flows, the MLflow store, the
warehouse and the stage cache all live under `home`.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import yaml
from rlvr_core.core.net import free_port

ROOT = Path(__file__).resolve().parent.parent
PREFECT_FILE = ROOT / "infra" / "prefect" / "prefect.yaml"
PROCESS_TEMPLATE = ROOT / "infra" / "prefect" / "process-base-job-template.json"
GPU_POOL, CPU_POOL = "rlvr-gpu", "rlvr-cpu"
HEARTBEAT_S = 30  # Prefect's minimum flow-run heartbeat interval
# A local (SQLite) Prefect server can stall for its database's 60 s busy timeout when two writers collide; the
# heartbeats sent meanwhile arrive when it resumes (measured: a 61 s gap in the server's log, heartbeats received
# 45 s after they were sent, a healthy sweep marked Crashed under a 75 s wait).
SERVER_STALL_S = 60
LOST_AFTER_S = 120  # no heartbeat for this long: the flow run's worker is gone (RLVR_LOST_AFTER_S overrides)
NIGHTLY_CRON = "0 3 * * *"  # the nightly-eval deployment's schedule (UTC) unless prefect_up is given another


def lost_after_s() -> int:
    """Seconds without a heartbeat after which a flow run counts as lost: $RLVR_LOST_AFTER_S, else LOST_AFTER_S.
    At least one heartbeat interval plus the longest the server may stall (SERVER_STALL_S), or a healthy run
    whose heartbeats arrive late is marked Crashed."""
    value = int(os.environ.get("RLVR_LOST_AFTER_S") or LOST_AFTER_S)
    floor = HEARTBEAT_S + SERVER_STALL_S
    if value < floor:
        raise ValueError(f"RLVR_LOST_AFTER_S={value}: must be at least {floor} s, one {HEARTBEAT_S} s heartbeat "
                         f"interval plus the {SERVER_STALL_S} s a local Prefect server can stall on its database "
                         "lock, or a healthy run whose heartbeats arrive late is marked Crashed")
    return value


def _bin(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def stack_env(home: Path, api_url: str, nightly_cron: str | None = None) -> dict[str, str]:
    """The environment of every stack process (and of anyone who wants to talk to the stack)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update({
        "PREFECT_API_URL": api_url,
        "PREFECT_HOME": str(home / "prefect-server"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_S),
        "PREFECT_WORKER_QUERY_SECONDS": "2",  # local: pick up runs quickly (default 10 s)
        "PREFECT_LOGGING_LEVEL": "INFO",
        "RLVR_HOME": str(home),
        "RLVR_PROJECT_ROOT": str(ROOT),
        "RLVR_GPU_POOL": GPU_POOL,
        "RLVR_CPU_POOL": CPU_POOL,
        "RLVR_NIGHTLY_CRON": nightly_cron or os.environ.get("RLVR_NIGHTLY_CRON") or NIGHTLY_CRON,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
    })
    return env


def _spawn(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    # Own session: the process and every flow run it starts share one process group, stopped together.
    return subprocess.Popen(cmd, env=env, cwd=str(ROOT), stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)


def _wait_healthy(api_url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prefect server exited with {proc.returncode}; see {log}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(api_url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"prefect server not healthy at {api_url} after {timeout_s:.0f} s; see {log}")


def _run(cmd: list[str], env: dict[str, str], what: str, timeout_s: float = 300) -> str:
    p = subprocess.run(cmd, env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=timeout_s)
    if p.returncode != 0:
        raise RuntimeError(f"{what} failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    return p.stdout


def start_worker(state: dict[str, Any], pool: str = GPU_POOL, name: str | None = None,
                 home: Path | None = None) -> int:
    """Start a worker for `pool`; its pid is added to the state (and returned). `home`: the worker's own
    `RLVR_HOME` (a machine of its own; stages hand over through `RLVR_STAGE_STORE`), else the stack's."""
    home = Path(home or state["home"])
    env = stack_env(home, state["api_url"])
    name = name or f"{pool}-{int(time.time())}"
    proc = _spawn([_bin("prefect"), "worker", "start", "--pool", pool, "--name", name, "--type", "process"],
                  env, home / "logs" / f"worker-{name}.log")
    state["pids"].append(proc.pid)
    state["workers"][pool] = proc.pid
    return proc.pid


def prefect_up(home: Path, *, gpu_slots: int = 2, deploy: bool = True, port: int = 0,
               database_url: str | None = None, nightly_cron: str | None = None,
               workers: bool = True, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Start server, pools, limits, automation, deployments and workers; returns the state for prefect_down.
    `port` 0: any free port. `database_url`: the server's database (postgresql+asyncpg://…), else SQLite.
    `workers` False: no worker (the caller starts its own with `start_worker`). `progress`: told each part
    as it is ready (`rlvr stack up` prints it)."""
    say = progress or (lambda _: None)
    home = Path(home).resolve()
    home.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = stack_env(home, api_url, nightly_cron)
    state: dict[str, Any] = {"home": str(home), "api_url": api_url, "ui_url": f"http://127.0.0.1:{port}",
                             "pids": [], "workers": {}, "work_pool": GPU_POOL, "work_pools": [GPU_POOL, CPU_POOL],
                             "database": "postgresql" if database_url else "sqlite"}
    log = home / "logs" / "prefect-server.log"
    server_env = {**env, "PREFECT_SERVER_DATABASE_CONNECTION_URL": database_url} if database_url else env
    server = _spawn([_bin("prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)], server_env, log)
    state["pids"].append(server.pid)
    state["server_pid"] = server.pid
    try:
        _wait_healthy(api_url, server, log)
        say(f"Prefect server answering on {api_url}")
        state["crashed_orphans"] = crash_orphaned_runs(api_url)  # before any worker of this start claims a run
        # The schedule is the user's: --nightly-cron, else $RLVR_NIGHTLY_CRON, else the one deployed on this
        # database (a restart keeps a cron set earlier, or edited in Prefect's UI), else NIGHTLY_CRON.
        deployed = (nightly_schedule(api_url) or {}).get("cron")
        env["RLVR_NIGHTLY_CRON"] = nightly_cron or os.environ.get("RLVR_NIGHTLY_CRON") or deployed or NIGHTLY_CRON
        state["nightly_cron"] = env["RLVR_NIGHTLY_CRON"]
        fingerprint = deploy_fingerprint(env, gpu_slots)
        # A restart on the same database: pools, limits, automation and deployments are there, unchanged.
        kept = deploy and _server_variable(api_url) == fingerprint and _deployments_there(api_url)
        state["deployments"] = "kept" if kept else "deployed" if deploy else "none"
        if not kept:
            _run([sys.executable, "-m", "flows.local_stack", "_setup", "--gpu-slots", str(gpu_slots)], env,
                 "stack setup")
        if deploy and not kept:
            _run([_bin("prefect"), "--no-prompt", "deploy", "--all", "--prefect-file", str(PREFECT_FILE)], env,
                 "prefect deploy")
            _set_server_variable(api_url, fingerprint)
        say("Prefect pools and deployments " + ("unchanged, kept" if kept else "deployed" if deploy else "skipped"))
        if workers:
            start_worker(state, CPU_POOL, "local-cpu")
            start_worker(state, GPU_POOL, "local-gpu")
            say(f"Prefect workers started on {CPU_POOL} and {GPU_POOL}")
    except BaseException:
        prefect_down(state)
        raise
    (home / "prefect-stack.json").write_text(json.dumps(state, indent=2))
    return state


DEPLOYED_VARIABLE = "rlvr_stack_deployed"  # a Prefect variable: the fingerprint of what `prefect_up` deployed


def deploy_fingerprint(env: dict[str, str], gpu_slots: int) -> str:
    """What the setup and deployments depend on: prefect.yaml and the job template, the flows' code (their
    parameters), the checkout, pools, schedule and GPU slots. Equal on a restart: nothing to deploy again."""
    h = hashlib.sha256()
    for f in [PREFECT_FILE, PROCESS_TEMPLATE, *sorted((ROOT / "flows").glob("*.py"))]:
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    keys = ("RLVR_PROJECT_ROOT", "RLVR_GPU_POOL", "RLVR_CPU_POOL", "RLVR_NIGHTLY_CRON")
    h.update(json.dumps([gpu_slots, lost_after_s(), *(env[k] for k in keys)]).encode())
    return h.hexdigest()[:32]


def _server_variable(api_url: str) -> str | None:
    """The fingerprint stored on the server (kept in its database, so it goes with `--delete-data`), or None."""
    try:
        with urllib.request.urlopen(f"{api_url}/variables/name/{DEPLOYED_VARIABLE}", timeout=10) as r:
            return json.loads(r.read()).get("value")
    except (OSError, ValueError):  # 404: never deployed on this database
        return None


def _deployments_there(api_url: str) -> bool:
    """Every deployment of prefect.yaml is on the server (none was deleted by hand)."""
    names = {d["name"] for d in yaml.safe_load(PREFECT_FILE.read_text())["deployments"]}
    req = urllib.request.Request(f"{api_url}/deployments/filter", data=b"{}", method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return names <= {d["name"] for d in json.loads(r.read())}
    except (OSError, ValueError):
        return False


def crash_orphaned_runs(api_url: str) -> int:
    """Flow runs of this stack's pools left Pending by the workers of its previous start (`down` stopped them
    while they submitted a run) are marked Crashed; the number marked. Such a run never heartbeats, so the
    lost-worker automation does not see it, and it holds its deployment's concurrency slot: with the nightly
    deployment's limit 1 (CANCEL_NEW), every later nightly run would be cancelled. Best effort: a failed call
    leaves the runs as they are."""
    try:
        runs = _api(api_url, "/flow_runs/filter", {"flow_runs": {"state": {"type": {"any_": ["PENDING"]}}},
                                                   "work_pools": {"name": {"any_": [GPU_POOL, CPU_POOL]}},
                                                   "limit": 200})
        for run in runs:
            _api(api_url, f"/flow_runs/{run['id']}/set_state",
                 {"state": {"type": "CRASHED", "name": "Crashed",
                            "message": "left Pending when the stack stopped: its worker is gone"}})
        return len(runs)
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def _api(api_url: str, path: str, body: Any = None, method: str = "POST") -> Any:
    req = urllib.request.Request(api_url + path, data=None if body is None else json.dumps(body).encode(),
                                 method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        raw = r.read()
    return json.loads(raw) if raw else None


def nightly_schedule(api_url: str) -> dict[str, Any] | None:
    """The nightly-eval deployment's cron schedule on the server: {"deployment_id", "schedule_id", "cron",
    "timezone", "active"}, or None (not deployed on this database, no cron schedule, or no server)."""
    try:
        deps = _api(api_url, "/deployments/filter", {"deployments": {"name": {"any_": ["nightly"]}}})
    except (OSError, ValueError):
        return None
    for dep in deps:
        for sch in dep.get("schedules") or []:
            if (sch.get("schedule") or {}).get("cron"):
                return {"deployment_id": dep["id"], "schedule_id": sch["id"], "cron": sch["schedule"]["cron"],
                        "timezone": sch["schedule"].get("timezone") or "UTC", "active": sch.get("active", True)}
    return None


def check_cron(cron: str) -> str:
    """`cron` as Prefect takes it, or ValueError in one line (what `--nightly-cron` accepts)."""
    from prefect.client.schemas.schedules import CronSchedule

    try:
        CronSchedule(cron=cron, timezone="UTC")
    except ValueError:
        raise ValueError(f"--nightly-cron {cron!r}: not a cron expression (five fields, UTC, e.g. '0 3 * * *')") from None
    return cron


def set_nightly_cron(state: dict[str, Any], cron: str, gpu_slots: int = 2) -> dict[str, Any]:
    """Change the running server's nightly-eval schedule to `cron` (UTC). Prefect drops the runs the old cron had
    scheduled and schedules the new ones. The deploy fingerprint follows, so the next `up` with this cron (or a
    plain one, which keeps it) deploys nothing again. Returns the schedule as `nightly_schedule` reads it."""
    check_cron(cron)
    api_url = state["api_url"]
    sch = nightly_schedule(api_url)
    if sch is None:
        raise RuntimeError(f"no nightly-eval deployment with a cron schedule on {api_url}: restart the stack "
                           "(rlvr stack down; rlvr stack up --nightly-cron ...) to deploy it")
    if sch["cron"] != cron:
        _api(api_url, f"/deployments/{sch['deployment_id']}/schedules/{sch['schedule_id']}",
             {"schedule": {"cron": cron, "timezone": "UTC"}}, method="PATCH")
        if _server_variable(api_url) == deploy_fingerprint(stack_env(Path(state["home"]), api_url, sch["cron"]),
                                                           gpu_slots):
            _set_server_variable(api_url, deploy_fingerprint(stack_env(Path(state["home"]), api_url, cron), gpu_slots))
    state["nightly_cron"] = cron
    return nightly_schedule(api_url) or {}


def _set_server_variable(api_url: str, value: str) -> None:
    body = json.dumps({"name": DEPLOYED_VARIABLE, "value": value}).encode()
    exists = _server_variable(api_url) is not None
    req = urllib.request.Request(f"{api_url}/variables/name/{DEPLOYED_VARIABLE}" if exists else f"{api_url}/variables/",
                                 data=body, method="PATCH" if exists else "POST",
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=10).close()


def _setup(gpu_slots: int) -> None:
    """Runs in a child process with the stack's PREFECT_API_URL: pools, the GPU limit, the lost-worker automation."""
    from prefect.automations import Automation
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.exceptions import ObjectAlreadyExists

    template = json.loads(PROCESS_TEMPLATE.read_text())

    async def pools() -> None:
        async with get_client() as client:
            for pool in (GPU_POOL, CPU_POOL):
                try:
                    await client.create_work_pool(WorkPoolCreate(name=pool, type="process",
                                                                 base_job_template=template))
                except ObjectAlreadyExists:
                    pass
            await client.create_concurrency_limit(tag="gpu", concurrency_limit=gpu_slots)

    asyncio.run(pools())
    lost_after = lost_after_s()
    name = "rlvr-crash-lost-flow-runs"
    try:
        kept = Automation.read(name=name)
        if kept.trigger.within == timedelta(seconds=lost_after):
            return
        kept.delete()  # set up with another RLVR_LOST_AFTER_S: replaced, not silently kept
    except ValueError:
        pass
    Automation(
        name=name, description="A flow run whose heartbeats stopped lost its worker: mark it Crashed so the "
                               "sweep launches it again (it resumes from its checkpoint).",
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", "prefect.flow-run.Completed", "prefect.flow-run.Failed",
                    "prefect.flow-run.Cancelled", "prefect.flow-run.Crashed"},
            match={"prefect.resource.id": ["prefect.flow-run.*"]}, for_each={"prefect.resource.id"},
            posture=Posture.Proactive, threshold=1, within=timedelta(seconds=lost_after)),
        actions=[ChangeFlowRunState(state=StateType.CRASHED,
                                    message=f"no heartbeat for {lost_after} s: its worker was lost")],
    ).create()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of ours is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return True


def stop_pid(pid: int, timeout_s: float = 20) -> None:
    """SIGTERM the process group (the process and what it started), then SIGKILL what is left."""
    stop_pids([pid], timeout_s)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    """Wait up to `timeout_s` for the processes to end (reaping our own children); the ones still alive."""
    deadline = time.monotonic() + timeout_s
    while True:
        for pid in pids:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        pids = [pid for pid in pids if _alive(pid)]
        if not pids or time.monotonic() >= deadline:
            return pids
        time.sleep(0.2)


def stop_pids(pids: list[int], timeout_s: float = 20) -> None:
    """`stop_pid` for several at once: all are asked to stop together, so the wait is the slowest one's
    grace period, not the sum of them."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            _signal_group(pid, sig)
        pids = _wait_gone(pids, timeout_s)
        if not pids:
            return


def prefect_down(state: dict[str, Any]) -> None:
    """Stop the workers (together), then the server, by pid (never by name): a worker shutting down may still
    report to the server."""
    server = state.get("server_pid")
    stop_pids([p for p in state.get("pids", []) if p != server])
    if server:
        stop_pid(server)
    state["pids"] = []


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m flows.local_stack")
    ap.add_argument("command", choices=["up", "down", "_setup"])
    ap.add_argument("--home", type=Path, default=Path(os.environ.get("RLVR_HOME", ".rlvr")))
    ap.add_argument("--gpu-slots", type=int, default=2)
    a = ap.parse_args(argv)
    if a.command == "_setup":
        _setup(a.gpu_slots)
        return 0
    state_file = a.home.resolve() / "prefect-stack.json"
    if a.command == "up":
        state = prefect_up(a.home, gpu_slots=a.gpu_slots)
        print(json.dumps(state, indent=2))
        print(f"\nexport PREFECT_API_URL={state['api_url']} RLVR_HOME={state['home']}", file=sys.stderr)
        return 0
    if not state_file.is_file():
        print(f"no stack state at {state_file}", file=sys.stderr)
        return 1
    prefect_down(json.loads(state_file.read_text()))
    state_file.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
