"""code verifier: planted escapes (write outside scratch, network, subprocess, time, memory) are stopped."""

import os
import time
from pathlib import Path

import pytest

from rlvr_core.verifiers import Status, get_verifier

V = get_verifier("code", time_limit_s=2.0)
TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]
GOOD = "def add(a, b):\n    return a + b\n"


def fenced(src):
    return f"Here you go:\n```python\n{src}```\n"


def test_correct_and_wrong_solutions():
    assert V.verify(fenced(GOOD), TESTS).status is Status.CORRECT
    out = V.verify(fenced("def add(a, b):\n    return a - b\n"), TESTS)
    assert out.status is Status.INCORRECT and "AssertionError" in out.detail
    assert V.verify("I cannot write this.", TESTS).status is Status.NO_ANSWER
    # HumanEval-style gold
    he = {"test": "def check(f):\n    assert f(2, 3) == 5\n", "entry_point": "add"}
    assert V.verify(fenced(GOOD), he).status is Status.CORRECT


def test_cannot_write_outside_scratch(tmp_path):
    project_file = Path(__file__).resolve().parents[2] / "PLANTED_BY_CODE_TEST.txt"
    outside = tmp_path / "outside.txt"
    for target in (project_file, outside):
        src = f"open({str(target)!r}, 'w').write('x')\n" + GOOD
        out = V.verify(fenced(src), TESTS)
        assert out.status is Status.INCORRECT and "PermissionError" in out.detail
        assert not target.exists()
    # rename/remove outside are refused too
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    out = V.verify(fenced(f"import os\nos.remove({str(victim)!r})\n" + GOOD), TESTS)
    assert out.status is Status.INCORRECT and victim.read_text() == "keep"
    # inside the scratch directory writing is fine
    src = "open('note.txt', 'w').write('x')\nassert open('note.txt').read() == 'x'\n" + GOOD
    assert V.verify(fenced(src), TESTS).status is Status.CORRECT


def test_cannot_start_processes(tmp_path):
    marker = tmp_path / "spawned"
    src = f"import os\nos.system('touch {marker}')\n" + GOOD
    assert V.verify(fenced(src), TESTS).status is Status.INCORRECT
    src = f"import subprocess\nsubprocess.run(['touch', '{marker}'])\n" + GOOD
    assert V.verify(fenced(src), TESTS).status is Status.INCORRECT
    assert not marker.exists()


def test_cannot_open_a_network_socket():
    src = "import socket\ns = socket.socket()\ns.connect(('127.0.0.1', 9))\n" + GOOD
    out = V.verify(fenced(src), TESTS)
    assert out.status is Status.INCORRECT and "socket" in out.detail


def test_cannot_read_project_files():
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    out = V.verify(fenced(f"open({str(pyproject)!r}).read()\n" + GOOD), TESTS)
    assert out.status is Status.INCORRECT and "protected" in out.detail


@pytest.mark.parametrize("src", ["while True:\n    pass\n", "import time\ntime.sleep(60)\n"])
def test_cannot_run_past_the_time_limit(src):
    t0 = time.monotonic()
    out = V.verify(fenced(src + GOOD), TESTS)
    assert out.status is Status.TIMEOUT
    assert time.monotonic() - t0 < 2.0 + 1.0


def test_memory_limit():
    out = V.verify(fenced("x = bytearray(4 * 1024 ** 3)\n" + GOOD), TESTS)
    assert out.status is Status.INCORRECT and "MemoryError" in out.detail


def test_bad_tests_are_an_error_not_incorrect():
    with pytest.raises(TypeError):
        V.verify(fenced(GOOD), 42)


@pytest.mark.parametrize("isolation", ["os", "hook-only"])
def test_scratch_dirs_are_cleaned_up(tmp_path, monkeypatch, isolation):
    import tempfile

    # This test's own temp folder: another xdist worker's verifications in the shared /tmp cannot show up here.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    verifier = get_verifier("code", time_limit_s=2.0, isolation=isolation)
    assert verifier.verify(fenced(GOOD), TESTS).status is Status.CORRECT
    assert verifier.verify(fenced("raise ValueError('no')"), TESTS).status is Status.INCORRECT
    assert not [p for p in os.listdir(tmp_path) if p.startswith(("rlvr-code-", "rlvr-sandbox-"))]


def test_the_hooks_state_cannot_be_rebound(tmp_path):
    """The boot runs as `__main__`, whose globals the program can reach (sys.modules["__main__"]). The hook's
    state and helpers live in closure cells: rebinding names there or patching os.path changes nothing (the
    hook once read SCRATCH and _inside from those globals, and this program wrote outside scratch)."""
    target = tmp_path / "escaped.txt"
    src = ("import os, sys\nm = sys.modules['__main__']\n"
           f"for name in list(vars(m)):\n    setattr(m, name, None)\nm.SCRATCH = {str(tmp_path)!r}\n"
           "m._inside = lambda *a: True\nos.path.realpath = lambda p, **k: os.getcwd() + '/x'\n"
           f"open({str(target)!r}, 'w').write('x')\n" + GOOD)
    out = V.verify(fenced(src), TESTS)
    assert out.status is Status.INCORRECT and "writing outside the scratch dir" in out.detail
    assert not target.exists()


def test_cannot_start_a_process_through_posixsubprocess(tmp_path):
    """_posixsubprocess.fork_exec (what subprocess calls) raises no audit event: importing it is refused. Before,
    this program started an unhooked /bin/touch that wrote outside scratch."""
    marker = tmp_path / "spawned"
    src = ("import os, _posixsubprocess\nr, w = os.pipe()\n"
           f"pid = _posixsubprocess.fork_exec([b'/bin/touch', {str(marker).encode()!r}], [b'/bin/touch'], True, (w,),"
           " None, None, -1, -1, -1, -1, -1, -1, r, w, True, False, -1, None, None, None, -1, None, False)\n"
           "os.waitpid(pid, 0)\n" + GOOD)
    out = V.verify(fenced(src), TESTS)
    assert out.status is Status.INCORRECT and "_posixsubprocess is not allowed" in out.detail
    assert not marker.exists()
