"""Claims in the artifact store: "this piece of work is mine", recorded before the work starts.

A claim on a folder `<claims>/` is a numbered object `<claims>/<generation>.json` holding the owner (e.g. a
Prefect flow run id) and the time. It is written with the store's create-if-absent (`ArtifactStore.create`: an
S3 conditional write, a hard link on disk), so of several runs claiming the same work at the same moment exactly
one wins. The latest generation is the current claim. A claim whose owner is gone (the caller decides: its
flow run crashed, was cancelled, finished without the work) or that is older than the lease is reclaimed by
writing the next generation, again create-if-absent, so two runs taking over a dead claim still get one winner
and nothing stays claimed forever.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable

from rlvr_core.artifacts.storage import ArtifactStore, join

LEASE_S = 6 * 3600  # a claim older than this is reclaimable even if its owner still looks alive


def current(store: ArtifactStore, folder: str) -> dict[str, Any] | None:
    """The latest claim under `folder`, or None."""
    keys = [k for k in store.list(folder) if k.endswith(".json")]
    return json.loads(store.get_text(keys[-1])) if keys else None


def claim(store: ArtifactStore, folder: str, owner: str, owner_gone: Callable[[dict[str, Any]], bool],
          lease_s: float = LEASE_S, **info: Any) -> dict[str, Any] | None:
    """Claim `folder` for `owner`: the claim record if `owner` holds it now, None if another live owner does."""
    last = current(store, folder)
    if last is not None:
        if last["owner"] == owner:
            return last
        if time.time() - last["claimed_at"] < lease_s and not owner_gone(last):
            return None
    gen = 0 if last is None else last["generation"] + 1
    rec = {"owner": owner, "generation": gen, "claimed_at": time.time(),
           "claimed_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "reclaimed_from": None if last is None else last["owner"], **info}
    return rec if store.create(join(folder, f"{gen:06d}.json"), json.dumps(rec).encode()) else None
