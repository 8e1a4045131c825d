"""PostgreSQL for a test's Prefect server, as `rlvr stack up` runs it (rlvr_core.pipeline.stack): on SQLite the
server stalled for its 60 s busy timeout when writers collided, delaying flow runs and heartbeats (docs/testing.md)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from rlvr_core.core.net import free_port
from rlvr_core.pipeline.stack import _start_postgres, _stop


@contextmanager
def prefect_database(folder: Path) -> Iterator[str]:
    """A PostgreSQL server with its data and log under `folder`; yields the `database_url` for `prefect_up`, and
    stops the server on exit."""
    pg = _start_postgres(free_port(), folder / "postgres", folder / "logs")
    try:
        yield pg["url"]
    finally:
        _stop(pg, sig=pg["stop_signal"])
