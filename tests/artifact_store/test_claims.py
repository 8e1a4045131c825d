"""Claims on both store backends (a folder, S3 on moto_server over HTTP): one winner among concurrent
writers, a live claim is respected, a dead or expired one is taken over once."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

from rlvr_core.artifacts import claims


def _race(fn, n: int = 8) -> list:
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(fn, range(n)))


def test_create_has_one_winner_and_keeps_its_bytes(store):
    won = _race(lambda i: store.create("jobs/a.json", f"writer {i}".encode()))
    assert won.count(True) == 1
    assert store.get_text("jobs/a.json") == f"writer {won.index(True)}"
    assert store.list("jobs") == ["jobs/a.json"]  # no temporary file left behind


def test_concurrent_claims_one_owner(store):
    got = _race(lambda i: claims.claim(store, "claims/ck", f"run-{i}", lambda c: False))
    winners = [g for g in got if g is not None]
    assert len(winners) == 1 and claims.current(store, "claims/ck")["owner"] == winners[0]["owner"]
    # The holder claiming again keeps it; another live run is refused.
    assert claims.claim(store, "claims/ck", winners[0]["owner"], lambda c: False)["generation"] == 0
    assert claims.claim(store, "claims/ck", "someone-else", lambda c: False) is None


def test_a_dead_claim_is_taken_over_once(store):
    assert claims.claim(store, "claims/ck", "crashed-run", lambda c: False)
    got = _race(lambda i: claims.claim(store, "claims/ck", f"run-{i}", lambda c: c["owner"] == "crashed-run"))
    winners = [g for g in got if g is not None]
    assert len(winners) == 1 and winners[0]["generation"] == 1 and winners[0]["reclaimed_from"] == "crashed-run"
    assert store.list("claims/ck") == ["claims/ck/000000.json", "claims/ck/000001.json"]


def test_an_expired_claim_is_taken_over_even_if_its_owner_looks_alive(store):
    old = {"owner": "hung-run", "generation": 0, "claimed_at": time.time() - 3600}
    store.create("claims/ck/000000.json", json.dumps(old).encode())
    assert claims.claim(store, "claims/ck", "next", lambda c: False, lease_s=7200) is None
    assert claims.claim(store, "claims/ck", "next", lambda c: False, lease_s=1800)["reclaimed_from"] == "hung-run"
