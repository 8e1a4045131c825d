"""`rlvr stack up|down|status|env`: the team stack's local equivalents on 127.0.0.1, without Docker.

    moto_server      an S3 API (bucket `rlvr`): the artifact store and MLflow's artifact destination
    mlflow server    sqlite backend, `--serve-artifacts` proxying artifacts to s3://rlvr/mlflow
    Prefect          server + process work pool + worker + deployments, when `flows.local_stack`
                     is importable (the orchestration layer provides it; `--no-prefect` skips it)

The processes outlive the command that started them. Their pids, URLs and the environment to export
go to `$RLVR_HOME/stack/state.json`, so `down` and `status` work from any later process; logs go to
`$RLVR_HOME/stack/logs/`. `down` stops exactly the processes recorded there (checked by pid *and*
start time, so a recycled pid is never signalled). The Docker equivalent is infra/compose/.

The S3 credentials are fixed dummies: moto accepts any, and a real secret must never be written to
the state file or printed by `env`.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Optional

import typer

from rlvr_core import settings

BUCKET = "rlvr"
LOCAL_S3_KEY = "rlvr-local"  # moto accepts any credentials; these are not secrets
LOCAL_S3_SECRET = "rlvr-local-not-a-secret"
DEFAULT_MLFLOW_PORT = 5000  # the same ports as infra/compose, so either stack answers the same URLs
DEFAULT_S3_PORT = 9000
START_TIMEOUT_S = 120.0

stack_app = typer.Typer(no_args_is_help=True, help="A local team stack (MLflow server, S3, Prefect) on 127.0.0.1.")


class StackError(RuntimeError):
    pass


def stack_dir(home: Path | None = None) -> Path:
    return (home or settings.rlvr_home()) / "stack"


def state_path(home: Path | None = None) -> Path:
    return stack_dir(home) / "state.json"


def read_state(home: Path | None = None) -> dict[str, Any] | None:
    p = state_path(home)
    if not p.is_file():
        return None
    try:
        return json.loads(p.read_text())
    except ValueError as e:
        raise StackError(f"{p}: not valid JSON ({e}); remove it after checking no stack process is running") from None


def _write_state(state: dict[str, Any], home: Path | None = None) -> None:
    p = state_path(home)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    os.chmod(tmp, 0o600)
    os.replace(tmp, p)


# ----------------------------------------------------------------------------------------- processes
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port(requested: int, what: str, option: str) -> int:
    """0 → any free port; otherwise the port, which must be free."""
    if requested == 0:
        return _free_port()
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", requested))
        except OSError:
            raise StackError(f"{what}: port {requested} on 127.0.0.1 is in use; pass {option} 0 for a free one "
                             f"or {option} N") from None
    return requested


def _exe(name: str) -> str:
    """A console script from this environment first (the venv's mlflow/moto_server), then PATH."""
    exe = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if exe is None:
        raise StackError(f"{name} not found (install it into this environment: pip install "
                         f"{'moto[server]' if name == 'moto_server' else name})")
    return exe


def _create_time(pid: int) -> float | None:
    """The process's start time, or None when it is gone (an exited, unreaped zombie counts as gone)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        return None if proc.status() == psutil.STATUS_ZOMBIE else proc.create_time()
    except psutil.Error:
        return None


def _spawn(name: str, argv: list[str], env: dict[str, str], logs: Path) -> dict[str, Any]:
    """Start a daemon in its own session (so it outlives us and `down` can stop its whole group)."""
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{name}.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return {"pid": proc.pid, "create_time": _create_time(proc.pid), "log": str(log), "argv": argv}


def _alive(entry: dict[str, Any]) -> bool:
    """The recorded process is still running (same pid *and* same start time)."""
    ct = _create_time(int(entry["pid"]))
    return ct is not None and (entry.get("create_time") is None or abs(ct - entry["create_time"]) < 1.0)


def _http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return 200 <= r.status < 300
    except Exception:  # noqa: BLE001 — any failure means "not healthy"
        return False


def _wait_healthy(entry: dict[str, Any], url: str, what: str, timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _http_ok(url):
            return
        if not _alive(entry):
            break
        time.sleep(0.3)
    tail = Path(entry["log"]).read_text(errors="replace")[-2000:] if Path(entry["log"]).exists() else ""
    _stop(entry)
    raise StackError(f"{what} did not become healthy at {url} within {timeout_s:.0f} s; log {entry['log']}:\n{tail}")


def _stop(entry: dict[str, Any], timeout_s: float = 15.0) -> str:
    """SIGTERM the process group we started, SIGKILL after `timeout_s`. Returns what happened."""
    pid = int(entry["pid"])
    if not _alive(entry):
        return "not running"
    try:
        os.killpg(pid, signal.SIGTERM)  # the group: mlflow server's uvicorn worker goes with it
    except ProcessLookupError:
        return "not running"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(entry):
            return "stopped"
        time.sleep(0.2)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return "killed"


# -------------------------------------------------------------------------------------------- up/down
def _start_moto(port: int, logs: Path) -> dict[str, Any]:
    entry = _spawn("moto", [_exe("moto_server"), "-H", "127.0.0.1", "-p", str(port)], dict(os.environ), logs)
    url = f"http://127.0.0.1:{port}"
    _wait_healthy(entry, url + "/moto-api/", "moto_server")
    import boto3

    s3 = boto3.client("s3", endpoint_url=url, aws_access_key_id=LOCAL_S3_KEY,
                      aws_secret_access_key=LOCAL_S3_SECRET, region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    return {**entry, "url": url, "bucket": BUCKET}


def _start_mlflow(port: int, sdir: Path, s3: dict[str, Any] | None, logs: Path) -> dict[str, Any]:
    env = dict(os.environ)
    # Two processes (~500 MB) instead of ~10: MLflow's job runner is not needed here (docs/stack.md).
    env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
    if s3:
        destination = f"s3://{BUCKET}/mlflow"
        env.update(MLFLOW_S3_ENDPOINT_URL=s3["url"], AWS_ACCESS_KEY_ID=LOCAL_S3_KEY,
                   AWS_SECRET_ACCESS_KEY=LOCAL_S3_SECRET, AWS_DEFAULT_REGION="us-east-1")
    else:
        destination = str(sdir / "mlflow-artifacts")
    argv = [_exe("mlflow"), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
            "--backend-store-uri", f"sqlite:///{sdir / 'mlflow.db'}", "--serve-artifacts",
            "--artifacts-destination", destination]
    entry = _spawn("mlflow", argv, env, logs)
    url = f"http://127.0.0.1:{port}"
    _wait_healthy(entry, url + "/health", "mlflow server")
    return {**entry, "url": url, "artifacts_destination": destination}


def exports(state: dict[str, Any]) -> dict[str, str]:
    """The environment that points the pipeline at this stack."""
    env = {"MLFLOW_TRACKING_URI": state["mlflow"]["url"]}
    if state.get("s3"):
        env.update(RLVR_ARTIFACT_URI=f"s3://{BUCKET}/artifacts", RLVR_S3_ENDPOINT_URL=state["s3"]["url"],
                   AWS_ACCESS_KEY_ID=LOCAL_S3_KEY, AWS_SECRET_ACCESS_KEY=LOCAL_S3_SECRET,
                   AWS_DEFAULT_REGION="us-east-1")
    else:
        env["RLVR_ARTIFACT_URI"] = str(stack_dir(Path(state["home"])) / "artifacts")
    if state.get("prefect", {}).get("api_url"):
        env["PREFECT_API_URL"] = state["prefect"]["api_url"]
    return env


def _prefect_hooks():
    """`flows.local_stack` (owned by the orchestration layer) if it exists; rlvr_core never imports
    Prefect itself. A module that exists but fails to import is an error, not a silent skip."""
    if importlib.util.find_spec("flows") is None or importlib.util.find_spec("flows.local_stack") is None:
        return None
    return importlib.import_module("flows.local_stack")


def up(*, home: Path | None = None, mlflow_port: int = DEFAULT_MLFLOW_PORT, s3_port: int = DEFAULT_S3_PORT,
       s3: bool = True, prefect: bool = True) -> dict[str, Any]:
    """Start the stack (or return the running one's state). Raises StackError with the failing log."""
    home = (home or settings.rlvr_home()).resolve()
    current = read_state(home)
    if current is not None:
        if all(_alive(current[c]) for c in ("mlflow", "s3") if current.get(c)):
            return {**current, "already_running": True}
        down(home=home)  # a stale or half-dead stack: clear it before starting again
    sdir = stack_dir(home)
    logs = sdir / "logs"
    state: dict[str, Any] = {"home": str(home), "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        if s3:
            state["s3"] = _start_moto(_port(s3_port, "moto_server", "--s3-port"), logs)
            _write_state(state, home)  # recorded at once: a failure below still lets `down` clean up
        state["mlflow"] = _start_mlflow(_port(mlflow_port, "mlflow server", "--mlflow-port"), sdir, state.get("s3"),
                                        logs)
        _write_state(state, home)
        hooks = _prefect_hooks() if prefect else None
        if hooks is not None:
            # The worker inherits this environment, so deployed flow runs log to this stack.
            os.environ.update(exports(state))
            state["prefect"] = hooks.prefect_up(home)
        else:
            state["prefect"] = {"skipped": "--no-prefect" if not prefect else "flows.local_stack not available"}
        state["env"] = exports(state)
        _write_state(state, home)
    except BaseException:
        down(home=home)
        raise
    return state


def down(*, home: Path | None = None) -> dict[str, str]:
    """Stop what the state file records (Prefect first, then MLflow, then S3) and remove the file."""
    home = (home or settings.rlvr_home()).resolve()
    state = read_state(home)
    if state is None:
        return {}
    result: dict[str, str] = {}
    pf = state.get("prefect") or {}
    if pf and not pf.get("skipped"):
        hooks = _prefect_hooks()
        if hooks is not None:
            hooks.prefect_down(pf)
            result["prefect"] = "stopped"
        else:
            result["prefect"] = "flows.local_stack not available: stop pids %s by hand" % pf.get("pids")
    for name in ("mlflow", "s3"):
        if state.get(name):
            result[name] = _stop(state[name])
    state_path(home).unlink(missing_ok=True)
    return result


def status(*, home: Path | None = None) -> dict[str, Any]:
    """Each component: its pid is ours and alive, and its URL answers."""
    state = read_state(home)
    if state is None:
        return {"running": False, "components": {}}
    comps: dict[str, Any] = {}
    if state.get("s3"):
        comps["s3"] = {"url": state["s3"]["url"], "pid": state["s3"]["pid"], "alive": _alive(state["s3"]),
                       "healthy": _http_ok(state["s3"]["url"] + "/moto-api/")}
    if state.get("mlflow"):
        comps["mlflow"] = {"url": state["mlflow"]["url"], "pid": state["mlflow"]["pid"], "alive": _alive(state["mlflow"]),
                           "healthy": _http_ok(state["mlflow"]["url"] + "/health")}
    pf = state.get("prefect") or {}
    if pf.get("api_url"):
        import psutil

        comps["prefect"] = {"url": pf["api_url"], "pids": pf.get("pids", []),
                            "alive": all(psutil.pid_exists(int(p)) for p in pf.get("pids", [])),
                            "healthy": _http_ok(pf["api_url"].rstrip("/") + "/health")}
    elif pf.get("skipped"):
        comps["prefect"] = {"skipped": pf["skipped"]}
    running = all(c.get("alive") and c.get("healthy") for c in comps.values() if "skipped" not in c)
    return {"running": running, "components": comps, "env": state.get("env", {}), "state_file": str(state_path(home))}


# ------------------------------------------------------------------------------------------------ CLI
def _print_env(env: dict[str, str]) -> None:
    for k, v in env.items():
        typer.echo(f"export {k}={v}")


@stack_app.command("up")
def up_command(
    mlflow_port: int = typer.Option(DEFAULT_MLFLOW_PORT, help="MLflow server port on 127.0.0.1 (0: any free port)"),
    s3_port: int = typer.Option(DEFAULT_S3_PORT, help="moto_server (S3) port on 127.0.0.1 (0: any free port)"),
    no_s3: bool = typer.Option(False, "--no-s3", help="artifacts in a local folder, no moto_server"),
    no_prefect: bool = typer.Option(False, "--no-prefect", help="do not start the Prefect server and worker"),
    json_out: bool = typer.Option(False, "--json", help="print the state as JSON instead of export lines"),
) -> None:
    """Start the stack on 127.0.0.1 and print the environment to export (eval "$(rlvr stack env)")."""
    try:
        state = up(mlflow_port=mlflow_port, s3_port=s3_port, s3=not no_s3, prefect=not no_prefect)
    except StackError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1)
    if json_out:
        typer.echo(json.dumps(state))
        return
    typer.echo(("stack already running" if state.get("already_running") else "stack up") +
               f" (state: {state_path()}, logs: {stack_dir() / 'logs'})", err=True)
    _print_env(state["env"])


@stack_app.command("down")
def down_command() -> None:
    """Stop the processes `up` started (by the pids in the state file)."""
    try:
        result = down()
    except StackError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1)
    typer.echo(json.dumps(result) if result else "no stack recorded in " + str(state_path()))


@stack_app.command("status")
def status_command(json_out: bool = typer.Option(False, "--json", help="machine-readable")) -> None:
    """Exit 0 when every component is alive and answering, 1 otherwise."""
    st = status()
    if json_out:
        typer.echo(json.dumps(st))
    elif not st["components"]:
        typer.echo("no stack recorded in " + str(state_path()))
    else:
        for name, c in st["components"].items():
            if "skipped" in c:
                typer.echo(f"{name:8} skipped ({c['skipped']})")
            else:
                ok = "up" if c["alive"] and c["healthy"] else ("alive, not answering" if c["alive"] else "down")
                typer.echo(f"{name:8} {ok:22} {c['url']}  pid {c.get('pid', c.get('pids'))}")
    raise typer.Exit(0 if st["running"] else 1)


@stack_app.command("env")
def env_command(name: Optional[str] = typer.Argument(None, help="print only this variable's value")) -> None:
    """Print `export` lines for the running stack (use: eval "$(rlvr stack env)")."""
    state = read_state()
    if state is None or "env" not in state:
        typer.echo("no stack running (rlvr stack up)", err=True)
        raise typer.Exit(1)
    if name:
        typer.echo(state["env"].get(name, ""))
    else:
        _print_env(state["env"])


if __name__ == "__main__":  # `python -m rlvr_core.stack up` works before the CLI registers `rlvr stack`
    stack_app()
