"""What a wrong program tries outside the Python process, each planted on the real verifier pool: reading another
item's tests, reading the input file on disk, outliving its item, signalling processes outside its item. Before
the OS sandbox (rlvr_core/sandbox) the first two scored 1, the third left its processes and tests behind, the
fourth killed the pool's worker. docs/verifiers.md, "The sandbox", has the threat model these rows back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from rlvr_cli.verify import run_verify
from rlvr_core.sandbox.sweep import sweep_stale
from rlvr_core.verifiers import Status
from rlvr_core.verifiers.pool import VerifierPool

TESTS = ["assert add(1234, 4321) == 5555", "assert add(20, 22) == 42"]
ROOT = Path(__file__).resolve().parents[2]

# Wrong for every input unless it finds the expected value of `add(a, b)` in a file it can read: the shape of a
# policy that learned to read the answers instead of adding. `FIND` is filled in per test.
WRONG = '''```python
import os, re, time

def _expected(a, b):
    pattern = re.compile(r"add\\(\\s*%d\\s*,\\s*%d\\s*\\)\\s*==\\s*(-?\\d+)" % (a, b))
    deadline = time.time() + 1.5
    while time.time() < deadline:
        for path in _candidates():
            try:
                with open(path, errors="replace") as f:
                    found = pattern.search(f.read(1 << 20))
            except OSError:
                continue
            if found:
                return int(found.group(1))
        time.sleep(0.02)
    return None

FIND

def add(a, b):
    value = _expected(a, b)
    return 0 if value is None else value
```'''

SIBLINGS = '''def _candidates():
    root = %r
    try:
        names = os.listdir(root)
    except OSError:
        return []
    return [os.path.join(root, name, leaf) for name in names for leaf in ("tests.json", "harness/tests.json")]
'''

WALK = '''def _candidates():
    found = []
    for folder, dirs, files in os.walk(%r):
        if folder.count("/") > 8:
            dirs[:] = []
        found += [os.path.join(folder, f) for f in files if f.endswith(".jsonl")]
    return found
'''


def _wrong(find: str) -> str:
    return WRONG.replace("FIND", find)


def test_a_group_of_8_wrong_solutions_reading_each_others_tests_scores_0():
    """A GRPO group: 8 responses to one prompt, verified at the same time, so each item's tests are in flight while
    the others run. Before: each listed the temp root and read a sibling's rlvr-code-*/tests.json."""
    wrong = _wrong(SIBLINGS % tempfile.gettempdir())
    right = "```python\ndef add(a, b):\n    return a + b\n```"
    with VerifierPool("code", options={"time_limit_s": 4.0}, workers=4, timeout_s=6.0) as pool:
        outs = pool.verify_many([(wrong, TESTS)] * 8 + [(right, TESTS)])
    assert [o.status for o in outs[:8]] == [Status.INCORRECT] * 8, [o.detail for o in outs]
    assert all("AssertionError" in o.detail for o in outs[:8])
    assert outs[8].status is Status.CORRECT  # the control


def test_the_input_file_read_by_walking_the_filesystem_scores_0(tmp_path):
    """`rlvr verify` on a file that holds the tests: before, the solution walked the temp root and read them."""
    rows = [{"response": _wrong(WALK % tempfile.gettempdir()), "tests": TESTS},
            {"response": "```python\ndef add(a, b):\n    return a + b\n```", "tests": TESTS}]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    counts = run_verify("code", inp, out, workers=2, timeout_s=6.0)
    verdicts = [json.loads(line) for line in out.read_text().splitlines()]
    assert [v["status"] for v in verdicts] == ["incorrect", "correct"], verdicts
    assert counts == {"incorrect": 1, "correct": 1}


def _item_processes(marker: str) -> list[str]:
    """Command lines of live processes that carry `marker` (the item's protected root is on its boot's argv)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            state = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                         if line.startswith("State:"))
        except (OSError, StopIteration):
            continue
        if marker.encode() in cmdline and "Z" not in state:
            found.append(f"{pid}: {cmdline[:120]!r}")
    return found


def _files_holding(marker: str) -> list[str]:
    """Files under the temp root's sandbox folders (either naming) that contain `marker`."""
    root, hits = tempfile.gettempdir(), []
    for name in os.listdir(root):
        if not name.startswith(("rlvr-code-", "rlvr-sandbox-")):
            continue
        for folder, _, files in os.walk(os.path.join(root, name)):
            for f in files:
                try:
                    if marker.encode() in Path(folder, f).read_bytes():
                        hits.append(os.path.join(folder, f))
                except OSError:
                    pass
    return hits


@pytest.mark.parametrize("isolation", ["os", "hook-only"])
def test_a_solution_sleeping_past_the_pools_timeout_leaves_no_process_and_no_folder(isolation):
    """The pool kills the worker at its timeout (the verifier's own limit is later): before, the solution and the
    tests' process lived on, orphaned in their own session, and the item's folder (tests and nonce) stayed."""
    marker = f"rlvr-marker-{uuid.uuid4().hex}"
    tests = [f"assert add(1, 2) == 3  # {marker}"]
    sleeper = "```python\nimport time\ntime.sleep(60)\ndef add(a, b):\n    return a + b\n```"
    options = {"time_limit_s": 30.0, "protected_roots": [f"/nonexistent/{marker}"], "isolation": isolation}
    with VerifierPool("code", options=options, workers=1, timeout_s=1.0) as pool:
        out = pool.verify(sleeper, tests)
        assert out.status is Status.TIMEOUT and "worker killed" in out.detail, out
        give_up = time.monotonic() + 10  # the kernel delivers the parent-death signal asynchronously
        while _item_processes(marker) and time.monotonic() < give_up:
            time.sleep(0.05)
        assert _item_processes(marker) == []
        if isolation == "os":
            assert _files_holding(marker) == []  # never on the host's disk
        else:  # a hook-only item's folder goes once the killed worker is reaped: by the next batch at the latest
            pool.verify("```python\ndef add(a, b):\n    return a + b\n```", ["assert add(1, 2) == 3"])
    assert _files_holding(marker) == []


def test_the_sweep_removes_folders_of_dead_runs_and_keeps_live_ones(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"rlvr-sandbox-{dead.pid}-abc"
    live = tmp_path / f"rlvr-sandbox-{os.getpid()}-def"
    old_layout = tmp_path / "rlvr-code-xyz"
    recent_old_layout = tmp_path / "rlvr-code-new"
    for folder in (stale, live, old_layout, recent_old_layout):
        (folder / "work").mkdir(parents=True)
        (folder / "tests.json").write_text("[]")
    os.utime(old_layout, (time.time() - 7200, time.time() - 7200))
    removed = sweep_stale(str(tmp_path))
    assert sorted(removed) == sorted([str(stale), str(old_layout)])
    assert live.exists() and recent_old_layout.exists() and not stale.exists()


def test_signals_through_pidfd_reach_no_process_outside_the_item():
    """`os.pidfd_open` + `signal.pidfd_send_signal` raise no audit event. Before, this solution killed its parent
    (the pool's worker) and any process of its uid whose number it knew."""
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        attack = ("```python\nimport os, signal\n"
                  f"for pid in (os.getppid(), {victim.pid}, 1):\n"
                  "    try:\n"
                  "        signal.pidfd_send_signal(os.pidfd_open(pid), signal.SIGKILL)\n"
                  "    except OSError:\n"
                  "        pass\n"
                  "def add(a, b):\n    return 0\n```")
        with VerifierPool("code", options={"time_limit_s": 4.0}, workers=1, spares=0, timeout_s=6.0) as pool:
            before = list(pool.pids)
            out = pool.verify(attack, TESTS)
            assert out.status is Status.INCORRECT and "AssertionError" in out.detail, out
            assert pool.pids == before and pool.stats["crashes"] == 0 and pool.stats["restarts"] == 0
        assert victim.poll() is None, "a process outside the item was killed"
    finally:
        victim.kill()
        victim.wait()


def test_without_bubblewrap_untrusted_code_is_refused_in_one_line_unless_opted_in(tmp_path):
    """A host with no bwrap on PATH: `rlvr verify` refuses before reading its input, saying what to do; the
    explicit opt-in runs with the audit hook alone."""
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text(json.dumps({"response": "```python\ndef add(a, b):\n    return a + b\n```", "tests": TESTS}) + "\n")
    env = {"PATH": str(tmp_path / "no-bwrap-here"), "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    cmd = [sys.executable, "-m", "rlvr_cli.main", "verify", "--verifier", "code", "--input", str(inp),
           "--output", str(out)]
    refused = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2, refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "bubblewrap (bwrap) is not installed" in lines[0] and "isolation" in lines[0], lines
    assert not out.exists()
    opted = subprocess.run([*cmd, "--isolation", "hook-only"], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=300)
    assert opted.returncode == 0, opted.stderr
    assert json.loads(out.read_text())["status"] == "correct"
