"""The sandbox's plain-data entry point: a Python program, limits and input files in, plain data out. The code
verifier's whole-program mode and the tool environments' `python` tool call it; the code verifier's split mode
(a solution serving a tests' process) starts `process.start` twice with the same boot.

The program runs after `boot.BOOT`'s audit hook is installed (the second layer inside the OS view); `completed`
is the boot's pass signal, so it is true only when the program's last statement ran without raising, whatever
the program did to its exit status. stdout and stderr go to files with no name on disk, capped by the file-size
limit; the first `output_bytes` of stdout and the last of stderr come back.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import tempfile
from typing import Any

from rlvr_core.sandbox.boot import BOOT, PASS_LINE
from rlvr_core.sandbox.process import PRIVATE_PREFIX, Limits, Paths, SandboxProcess, start


def hidden_prefixes() -> str:
    """Path prefixes the audit hook refuses to read or list: every item's private folder under the temp root (they
    exist only under hook-only isolation; under `os` the temp root is not in the view at all)."""
    return os.path.join(tempfile.gettempdir(), PRIVATE_PREFIX)


def boot_args(paths: Paths, protected: list[str], result_fd: int, serve_fds: tuple[int, ...] = ()) -> list[str]:
    """The interpreter's arguments that run the scratch folder's `program.py` under the boot (its argv)."""
    return ["-I", "-S", "-c", BOOT, paths.scratch, os.pathsep.join(protected), hidden_prefixes(),
            f"{paths.harness}/nonce", str(result_fd), str(PASS_LINE), *map(str, serve_fds)]


def start_program(program: str, *, isolation: str, limits: Limits, protected: list[str], stderr: Any,
                  serve_fds: tuple[int, ...] = (), inputs: dict[str, bytes] | None = None,
                  stdin: Any = subprocess.DEVNULL, stdout: Any = subprocess.DEVNULL) -> tuple[SandboxProcess, int, bytes]:
    """Start `program` under the boot; returns the process, the read end of its pass-signal pipe and the nonce the
    pipe holds when the program's last statement ran."""
    nonce = secrets.token_hex(16).encode()
    read_end, write_end = os.pipe()
    files = {**(inputs or {}), "program.py": program.encode() + b"\n"}
    try:
        proc = start(lambda paths: boot_args(paths, protected, write_end, serve_fds), isolation=isolation,
                     limits=limits, files=files, harness={"nonce": nonce}, pass_fds=(write_end, *serve_fds),
                     stdin=stdin, stdout=stdout, stderr=stderr)
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    return proc, read_end, nonce


def signalled(fd: int, nonce: bytes) -> bool:
    """The pass-signal pipe holds exactly this run's nonce."""
    os.set_blocking(fd, False)
    try:
        return os.read(fd, len(nonce) + 1) == nonce
    except BlockingIOError:
        return False


def _head(f: Any, size: int) -> str:
    f.seek(0)
    return f.read(size).decode(errors="replace")


def _tail(f: Any, size: int) -> str:
    f.seek(max(0, f.seek(0, os.SEEK_END) - size))
    return f.read().decode(errors="replace")


def run_program(program: str, *, inputs: dict[str, str | bytes] | None = None, stdin: str | bytes = b"",
                limits: Limits | None = None, isolation: str = "os", protected: list[str] | None = None,
                output_bytes: int = 64 * 1024) -> dict[str, Any]:
    """Run the Python `program` in the sandbox: `inputs` (file name -> content) in its scratch folder (its cwd),
    `stdin` on its standard input. Returns plain data: `returncode` (None when killed at the time limit),
    `completed` (its last statement ran), `timed_out`, `stdout` (the first `output_bytes`), `stderr` (the last),
    `isolation` and the limits."""
    limits = limits or Limits()
    encoded = {name: data.encode() if isinstance(data, str) else bytes(data) for name, data in (inputs or {}).items()}
    for name in encoded:
        if not name or "/" in name or name in (".", "..", "program.py"):
            raise ValueError(f"sandbox input names are plain file names other than program.py, got {name!r}")
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as inp:
        inp.write(stdin.encode() if isinstance(stdin, str) else stdin)
        inp.seek(0)
        proc, signal_fd, nonce = start_program(program, isolation=isolation, limits=limits,
                                               protected=protected or [], stderr=err, inputs=encoded,
                                               stdin=inp, stdout=out)
        try:
            with proc:
                finished = proc.wait(limits.time_s)
                proc.kill()
                completed = finished and signalled(signal_fd, nonce)
                returncode = proc.returncode if finished else None
        finally:
            os.close(signal_fd)
        return {"returncode": returncode, "completed": completed, "timed_out": not finished,
                "stdout": _head(out, output_bytes), "stderr": _tail(err, output_bytes), "isolation": isolation,
                "limits": {"time_s": limits.time_s, "memory_mb": limits.memory_mb, "file_mb": limits.file_mb}}
