"""The filesystem and namespaces a sandboxed program sees under bubblewrap.

Read-only: `/usr` (with the `/bin`, `/lib`, `/lib64`, `/sbin` links or folders of the host) and the interpreter's
own prefix (its standard library and `lib-dynload`), with every `site-packages` of that prefix hidden under an empty
tmpfs; bwrap's root and `/dev` (so no tmpfs but the scratch folder can fill memory). Writable: the scratch folder, a size-capped tmpfs that holds the program's files and is its cwd, HOME and
TMPDIR. Read-only harness files (a pass-signal nonce, a tests' spec) appear under `HARNESS`, copied in from file
descriptors, so neither exists on the host's disk. Nothing else: no `/etc`, no `/home`, no temp root, no project
checkout, no dataset, no cache. `/proc` is the sandbox's own PID namespace's: the program sees its own processes
only, so it can neither read nor signal (`kill`, `pidfd_send_signal`) any process outside its item. No network
(a new network namespace holds only a down loopback), no capabilities, uid 65534 (nobody), no new user namespaces
where bwrap knows `--disable-userns`, and `--die-with-parent`: the sandbox dies with the process that started it.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from functools import lru_cache

SCRATCH = "/sandbox/work"
HARNESS = "/sandbox/harness"
# The namespaces and identity every sandboxed process gets (see the module docstring).
_NAMESPACES = ["--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
               "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--uid", "65534", "--gid", "65534",
               "--cap-drop", "ALL", "--hostname", "sandbox"]
_TOP_LEVEL = ("/bin", "/lib", "/lib64", "/lib32", "/libx32", "/sbin")


def python_executable() -> str:
    """The interpreter the sandbox runs: the real file behind `sys.executable` (a venv's link points outside the
    view)."""
    return os.path.realpath(sys.executable)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


@lru_cache(maxsize=1)
def _system_binds() -> tuple[str, ...]:
    """/usr and the top-level links (or folders) to it, as the host has them."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in _TOP_LEVEL:
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    return tuple(args)


@lru_cache(maxsize=1)
def _python_binds() -> tuple[str, ...]:
    """The interpreter's prefix (and its executable's folder when elsewhere), read-only, its site-packages hidden."""
    exe = python_executable()
    roots = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.base_exec_prefix)}
    if not any(_inside(exe, root) for root in roots):
        roots.add(os.path.dirname(exe))
    binds = [root for root in sorted(roots) if not _inside(root, "/usr")]
    args = [arg for root in binds for arg in ("--ro-bind", root, root)]
    scheme = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix, "installed_base": sys.base_prefix,
              "installed_platbase": sys.base_exec_prefix}
    hidden = {os.path.realpath(sysconfig.get_paths(vars=scheme)[key]) for key in ("purelib", "platlib")}
    for path in sorted(hidden):
        if os.path.isdir(path) and any(_inside(path, root) for root in [*binds, "/usr"]):
            args += ["--tmpfs", path]
    return tuple(args)


def prepare_view() -> None:
    """Compute the binds once (they read sysconfig and the host's top-level folders)."""
    _system_binds()
    _python_binds()


def bwrap_argv(exe: str, features: frozenset[str], scratch_bytes: int, files: dict[str, int], harness: dict[str, int],
               info_fd: int) -> list[str]:
    """bwrap's arguments up to the command: `files` (name -> readable fd) copied into the scratch folder,
    `harness` (name -> fd) as read-only files under HARNESS; bwrap reports the sandbox's PID 1 on `info_fd`."""
    args = [exe, *_NAMESPACES]
    if "--disable-userns" in features:
        args.append("--disable-userns")
    # /dev read-only too: its devices still work, but no unbounded tmpfs (/dev/shm) is left to fill memory with.
    args += [*_system_binds(), *_python_binds(), "--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev"]
    if "--size" in features:
        args += ["--size", str(scratch_bytes)]
    args += ["--tmpfs", SCRATCH]
    for name, fd in files.items():
        args += ["--file", str(fd), f"{SCRATCH}/{name}"]
    for name, fd in harness.items():
        args += ["--ro-bind-data", str(fd), f"{HARNESS}/{name}"]
    args += ["--remount-ro", "/"]  # bwrap's root is a tmpfs: read-only, so only the size-capped scratch fills
    env = {"PATH": "/usr/bin:/bin", "HOME": SCRATCH, "TMPDIR": SCRATCH, "LANG": "C.UTF-8"}
    args += ["--chdir", SCRATCH, "--clearenv", *[a for k, v in env.items() for a in ("--setenv", k, v)]]
    return [*args, "--info-fd", str(info_fd), "--"]
