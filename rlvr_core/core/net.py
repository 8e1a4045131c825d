"""Network helpers shared by every process the project starts (servers, process groups, test stacks)."""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the kernel's pick; free until someone binds it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
