"""The operating system's layer of the sandbox alone: programs started with `rlvr_core.sandbox.process.start`
WITHOUT the boot's audit hook, so each check here holds because of what bubblewrap built (the view, the
namespaces, the identity), not because the hook refused a call. Then the plain-data entry point, `run_program`,
which runs under both layers."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from rlvr_core.sandbox.process import Limits, start
from rlvr_core.sandbox.run import run_program
from rlvr_core.sandbox.view import SCRATCH

ROOT = Path(__file__).resolve().parents[2]


def bare(code: str, limits_mb: int = 64, **kwargs) -> dict:
    """Run `code` in the OS sandbox with no audit hook; its last stdout line is a JSON report."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        limits = Limits(time_s=10, file_mb=limits_mb)
        proc = start(lambda paths: ["-I", "-S", "-c", code], isolation="os", limits=limits,
                     stdout=out, stderr=err, **kwargs)
        with proc:
            assert proc.wait(20), "the sandboxed program did not end"
            rc = proc.returncode
        out.seek(0)
        err.seek(0)
        text = out.read().decode()
        assert rc == 0, err.read().decode()
        return json.loads(text.strip().splitlines()[-1])


def test_the_view_holds_the_interpreter_and_its_scratch_and_nothing_of_ours(tmp_path):
    secret = tmp_path / "data.jsonl"
    secret.write_text('{"answer": 42}\n')
    report = bare(f"""
import json, os, sys
def exists(p):
    return os.path.exists(p)
print(json.dumps({{
    "root": sorted(os.listdir("/")),
    "cwd": os.getcwd(),
    "scratch": sorted(os.listdir(".")),
    "checkout": exists({str(ROOT)!r}),
    "data": exists({str(secret)!r}),
    "tmp_root": exists({tempfile.gettempdir()!r}) and {tempfile.gettempdir()!r} != "/sandbox",
    "home": exists({os.path.expanduser("~")!r} + "/.cache"),
    "etc": exists("/etc"),
    "site_packages": [p for p in os.listdir(os.path.dirname(os.__file__) + "/site-packages")],
}}))
""", files={"input.txt": b"mine"})
    assert set(report["root"]) <= {"usr", "bin", "lib", "lib64", "lib32", "libx32", "sbin", "proc", "dev",
                                   "sandbox", "root", "opt", "home"}, report["root"]
    assert report["cwd"] == SCRATCH and report["scratch"] == ["input.txt"]
    assert not report["checkout"] and not report["data"] and not report["tmp_root"] and not report["etc"]
    assert not report["home"] and report["site_packages"] == []


def test_it_runs_as_nobody_with_no_capabilities_and_cannot_write_the_system():
    report = bare("""
import json, os
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
writes = {}
for path in ("/usr/rlvr-test", os.path.dirname(os.__file__) + "/rlvr-test", "/rlvr-test", "/dev/shm/rlvr-test",
             "/sandbox/rlvr-test", "/proc/rlvr-test"):
    try:
        open(path, "w").close()
        writes[path] = "written"
    except OSError as exc:
        writes[path] = type(exc).__name__
print(json.dumps({"uid": os.getuid(), "cap_eff": status["CapEff"].strip(), "writes": writes}))
""")
    assert report["uid"] == 65534 and int(report["cap_eff"], 16) == 0
    assert "written" not in report["writes"].values(), report["writes"]


def test_it_sees_and_signals_no_process_outside_its_item():
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        report = bare(f"""
import json, os, signal
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
results = {{}}
for pid in ({victim.pid}, {os.getpid()}):
    try:
        signal.pidfd_send_signal(os.pidfd_open(pid), signal.SIGKILL)
        results[pid] = "sent"
    except OSError as exc:
        results[pid] = exc.errno
print(json.dumps({{"pids": pids, "me": os.getpid(), "results": results}}))
""")
        assert report["pids"] == [1, report["me"]], report  # the sandbox's PID 1 and itself
        assert victim.poll() is None and "sent" not in report["results"].values(), report
    finally:
        victim.kill()
        victim.wait()


def test_the_callers_environment_reaches_no_process_of_the_sandbox(monkeypatch):
    marker = f"rlvr-secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", marker)
    report = bare("""
import json, os
seen = {p: open(f"/proc/{p}/environ", "rb").read().decode(errors="replace") for p in ("1", "self")}
print(json.dumps({"environ": dict(os.environ), "proc": seen}))
""")
    assert marker not in json.dumps(report)
    assert set(report["environ"]) <= {"PATH", "HOME", "TMPDIR", "LANG", "PWD"}


def test_it_has_no_network():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    try:
        report = bare(f"""
import json, socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2)
    reached = "connected"
except OSError as exc:
    reached = type(exc).__name__
print(json.dumps({{"reached": reached, "interfaces": [name for _, name in socket.if_nameindex()]}}))
""")
        assert report["reached"] != "connected" and report["interfaces"] == ["lo"], report
        with pytest.raises(socket.timeout):
            server.accept()
    finally:
        server.close()


def _alive_with(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            pass
    return found


def test_a_double_forked_setsid_child_dies_with_its_item():
    marker = f"rlvr-orphan-{uuid.uuid4().hex}"
    code = f"""
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/bin/sleep", ["sleep", "120", "{marker}"])
    os._exit(0)
time.sleep(0.3)
"""
    with tempfile.TemporaryFile() as err:
        proc = start(lambda paths: ["-I", "-S", "-c", code], isolation="os", limits=Limits(time_s=10), stderr=err)
        with proc:
            assert proc.wait(20)
        # The program ended by itself: its namespace ended with it, the grandchild too.
    give_up = time.monotonic() + 10
    while _alive_with(marker) and time.monotonic() < give_up:
        time.sleep(0.05)
    assert _alive_with(marker) == []


def test_run_program_takes_and_returns_plain_data():
    result = run_program("import sys\nprint(open('numbers.txt').read().split(), sys.stdin.read())\n"
                         "raise SystemExit(0)", inputs={"numbers.txt": "3 4"}, stdin="question")
    assert json.loads(json.dumps(result)) == result  # plain data only
    assert result["stdout"] == "['3', '4'] question\n" and result["returncode"] == 0
    assert result["completed"] is False  # it exited before its last statement ran to its end
    ok = run_program("print(6 * 7)")
    assert ok["completed"] is True and ok["stdout"] == "42\n" and ok["timed_out"] is False
    late = run_program("import time\ntime.sleep(30)", limits=Limits(time_s=1))
    assert late["timed_out"] is True and late["returncode"] is None and late["completed"] is False
    with pytest.raises(ValueError, match="plain file names"):
        run_program("pass", inputs={"../x": "no"})


def test_the_scratch_folder_is_capped_at_the_file_size_limit():
    report = bare("""
import json
written = 0
try:
    for i in range(6):
        with open(f"part{i}", "wb") as f:
            f.write(b"x" * (4 << 20))
        written += 1
    outcome = "all written"
except OSError as exc:
    outcome = exc.strerror
print(json.dumps({"written": written, "outcome": outcome}))
""", limits_mb=16)
    assert report["written"] < 6 and report["outcome"] == "No space left on device", report
