"""Start a Python program in the sandbox and end every process it started.

One item is one `SandboxProcess`. Under `os` isolation it is bubblewrap's process tree: the outer bwrap (our child),
the sandbox's PID 1 and the program, in a PID namespace of their own. Ending the item kills the sandbox's PID 1,
and the kernel then kills every process left in that namespace before PID 1's exit is reported: when `kill`
returns, nothing the item started is alive, whatever it forked, `setsid`-ed or double-forked. The item's files live
in the sandbox's tmpfs, so they are gone with it. If the process that started the item dies first (a pool worker
killed at its deadline), `--die-with-parent` takes the sandbox down with it.

Under `hook-only` isolation the program is our child in its own session (killed as a process group) with a
parent-death signal, and its files live in a private folder `rlvr-sandbox-<pid>-*` under the temp root, removed
when the item ends; `sweep.sweep_stale` removes those of processes that died before they could.

Limits, as before the sandbox: RLIMIT_AS (memory), RLIMIT_CPU (time limit + 1 s), RLIMIT_FSIZE (file size, also the
scratch tmpfs's size), no core files; the caller waits with a wall-clock deadline (`wait`).
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

from rlvr_core.sandbox.host import BWRAP_ENV, bwrap_exe, bwrap_features, check_isolation
from rlvr_core.sandbox.view import HARNESS, SCRATCH, bwrap_argv, prepare_view, python_executable

PRIVATE_PREFIX = "rlvr-sandbox-"  # hook-only items' folders: rlvr-sandbox-<pid of the starter>-<random>
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Limits:
    """What one sandboxed program may use: wall-clock seconds (the caller's deadline; CPU seconds are capped at one
    more), address space and the largest file it may write (also the size of its scratch folder)."""

    time_s: float = 5.0
    memory_mb: int = 512
    file_mb: int = 64

    def __post_init__(self) -> None:
        for name in ("time_s", "memory_mb", "file_mb"):
            if not getattr(self, name) > 0:
                raise ValueError(f"sandbox limit {name} must be > 0, got {getattr(self, name)!r}")

    def apply(self) -> None:
        """Set the limits on the calling process (between fork and exec)."""
        mem = self.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        cpu = int(self.time_s) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        size = self.file_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


@dataclass(frozen=True)
class Paths:
    """Where the program finds its scratch folder (cwd, writable) and the harness's read-only files."""

    scratch: str
    harness: str


@lru_cache(maxsize=1)
def _prctl() -> Any:
    return ctypes.CDLL(None, use_errno=True).prctl


def _preexec(limits: Limits) -> Callable[[], None]:
    prctl = _prctl()  # resolved in the parent: the child between fork and exec only calls it

    def child() -> None:
        os.setsid()  # own process group and session: a kill reaches all of it, no terminal
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # dies with the process that started it
        limits.apply()

    return child


def _data_fd(data: bytes) -> int:
    """A readable descriptor holding `data`, with no name on any disk (bwrap copies it into the sandbox)."""
    fd = os.memfd_create("rlvr-sandbox", os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def warm_up(isolation: str) -> None:
    """Do once what every start needs (probes, the view's binds, libc's prctl), before any item's clock runs."""
    check_isolation(isolation)
    _prctl()
    if isolation == "os":
        bwrap_features()
        prepare_view()
    else:
        _unshare_net()


def start(python_args: Callable[[Paths], list[str]], *, isolation: str, limits: Limits,
          files: dict[str, bytes] | None = None, harness: dict[str, bytes] | None = None,
          pass_fds: tuple[int, ...] = (), stdin: Any = subprocess.DEVNULL, stdout: Any = subprocess.DEVNULL,
          stderr: Any = subprocess.DEVNULL) -> SandboxProcess:
    """Start the interpreter with `python_args(paths)` in the sandbox: `files` (name -> content) in its scratch
    folder, `harness` (name -> content) read-only under `paths.harness`, `pass_fds` inherited."""
    check_isolation(isolation)
    if isolation == "os":
        return _start_bwrap(python_args, limits, files or {}, harness or {}, pass_fds, (stdin, stdout, stderr))
    return _start_hook_only(python_args, limits, files or {}, harness or {}, pass_fds, (stdin, stdout, stderr))


def _start_bwrap(python_args, limits, files, harness, pass_fds, stdio) -> SandboxProcess:
    fds = {"files": {name: _data_fd(data) for name, data in files.items()},
           "harness": {name: _data_fd(data) for name, data in harness.items()}}
    data_fds = [*fds["files"].values(), *fds["harness"].values()]
    info_r, info_w = os.pipe()
    try:
        features = bwrap_features() or frozenset()
        argv = bwrap_argv(str(bwrap_exe()), features, limits.file_mb * 1024 * 1024, fds["files"], fds["harness"],
                          info_w)
        argv += [python_executable(), *python_args(Paths(SCRATCH, HARNESS))]
        proc = subprocess.Popen(argv, env=BWRAP_ENV, stdin=stdio[0], stdout=stdio[1], stderr=stdio[2],
                                pass_fds=(*pass_fds, *data_fds, info_w), preexec_fn=_preexec(limits))
    except BaseException:
        os.close(info_r)
        raise
    finally:
        for fd in (*data_fds, info_w):
            os.close(fd)
    return SandboxProcess(proc, "os", info_r, None)


def _init_pidfd(info_fd: int, bwrap_pid: int) -> int | None:
    """A pidfd of the sandbox's PID 1 (bwrap's child, reported on `--info-fd`), or None when it is gone. Read when
    the item is killed, not at the start, so that two sandboxes of one item set up at the same time. The pidfd
    pins the process, and its parent must still be bwrap: a number reused since cannot be signalled."""
    pid = _read_child_pid(info_fd, 10.0)
    if pid is None:
        return None
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:  # already gone (its namespace with it)
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        if int(stat[stat.rfind(b")") + 2:].split()[1]) == bwrap_pid:
            return pidfd
    except (OSError, ValueError, IndexError):
        pass
    os.close(pidfd)
    return None


def _read_child_pid(fd: int, timeout_s: float) -> int | None:
    """The sandbox's PID 1 as the host sees it (bwrap's `--info-fd` JSON); None when bwrap ended before writing it."""
    poller, data = select.poll(), b""
    poller.register(fd, select.POLLIN)
    while b"}" not in data and poller.poll(timeout_s * 1000):
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    try:
        return int(json.loads(data)["child-pid"])
    except (ValueError, KeyError, TypeError):
        return None


def _start_hook_only(python_args, limits, files, harness, pass_fds, stdio) -> SandboxProcess:
    private = tempfile.mkdtemp(prefix=f"{PRIVATE_PREFIX}{os.getpid()}-")
    try:
        paths = Paths(os.path.join(private, "work"), os.path.join(private, "harness"))
        for folder, contents in ((paths.scratch, files), (paths.harness, harness)):
            os.mkdir(folder)
            for name, data in contents.items():
                with open(os.path.join(folder, name), "wb") as f:
                    f.write(data)
        env = {"PATH": "/usr/bin:/bin", "HOME": paths.scratch, "TMPDIR": paths.scratch, "LANG": "C.UTF-8"}
        proc = subprocess.Popen([*_unshare_net(), sys.executable, *python_args(paths)], cwd=paths.scratch, env=env,
                                stdin=stdio[0], stdout=stdio[1], stderr=stdio[2], pass_fds=pass_fds,
                                preexec_fn=_preexec(limits))
    except BaseException:
        shutil.rmtree(private, ignore_errors=True)
        raise
    return SandboxProcess(proc, "hook-only", None, private)


@lru_cache(maxsize=1)
def _unshare_net() -> tuple[str, ...]:
    """["unshare", "-rn"] when an unprivileged network namespace can be created here, else () (hook-only)."""
    exe = shutil.which("unshare")
    if not exe:
        return ()
    try:
        ok = subprocess.run([exe, "-rn", "true"], capture_output=True, timeout=5).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return (exe, "-rn") if ok else ()


class SandboxProcess:
    """One sandboxed program while it runs; `close` (or leaving a `with`) ends every process it started and removes
    its files."""

    def __init__(self, proc: subprocess.Popen, isolation: str, info_fd: int | None, private: str | None) -> None:
        self.proc, self.isolation, self.info_fd, self.private = proc, isolation, info_fd, private

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        """The program's exit status, negative for a signal (bwrap reports a signal as 128 + its number)."""
        rc = self.proc.returncode
        if self.isolation == "os" and rc is not None and 128 < rc < 128 + signal.NSIG:
            return -(rc - 128)
        return rc

    def poll(self) -> int | None:
        self.proc.poll()
        return self.returncode

    def wait(self, timeout_s: float) -> bool:
        """Wait for the program to end (True) or `timeout_s` (False). A pidfd wakes the caller at the exit itself;
        `Popen.wait(timeout)` polls with sleeps growing to 50 ms."""
        try:
            pidfd = os.pidfd_open(self.proc.pid)
        except (AttributeError, OSError):  # no pidfd here, or already reaped
            try:
                self.proc.wait(timeout=timeout_s)
                return True
            except subprocess.TimeoutExpired:
                return False
        try:
            poller = select.poll()  # not select.select: a pool worker's fd numbers may pass FD_SETSIZE
            poller.register(pidfd, select.POLLIN)
            if not poller.poll(timeout_s * 1000):
                return False
        finally:
            os.close(pidfd)
        self.proc.wait()
        return True

    def kill(self) -> None:
        """End every process of the item and wait until they are gone."""
        pidfd = None
        if self.proc.poll() is None and self.info_fd is not None:
            pidfd = _init_pidfd(self.info_fd, self.proc.pid)
        if pidfd is not None:
            try:
                _signal(lambda: signal.pidfd_send_signal(pidfd, signal.SIGKILL))  # the namespace's PID 1
            finally:
                os.close(pidfd)
            try:
                self.proc.wait(timeout=10)  # bwrap reports PID 1's end once the kernel emptied its namespace
            except subprocess.TimeoutExpired:
                pass
        if self.proc.poll() is None:
            _signal(lambda: os.killpg(self.proc.pid, signal.SIGKILL))
        self.proc.wait()

    def close(self) -> None:
        try:
            self.kill()
        finally:
            if self.info_fd is not None:
                os.close(self.info_fd)
                self.info_fd = None
            if self.private is not None:
                shutil.rmtree(self.private, ignore_errors=True)

    def __enter__(self) -> SandboxProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _signal(send: Callable[[], None]) -> None:
    try:
        send()
    except ProcessLookupError:
        pass
