"""Deterministic, distinct seeds per generation request (BUGZOO G-fixed-seed).

One fixed seed on every request made 83 rollouts collapse to 3 distinct completion sets. Each request
therefore gets its own seed, derived from everything that identifies it: the run seed, the prompt id,
the epoch, the step and the sample index within the prompt's group. The derivation is an unkeyed
BLAKE2b hash of a canonical encoding, so it is the same across processes, machines and Python
versions (Python's ``hash()`` of a str is salted per process and must never be used for this).
"""

from __future__ import annotations

import hashlib
import json

__all__ = ["request_seed", "SEED_BITS"]

SEED_BITS = 63
_DOMAIN = "rlvr.request_seed.v1"


def _check_int(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    return v


def request_seed(run_seed: int, prompt_id: str, step: int, sample_index: int, epoch: int = 0) -> int:
    """Seed in [0, 2**63) for one request.

    The encoding is the JSON array [domain, run_seed, prompt_id, epoch, step, sample_index], which is
    unambiguous (no two different tuples encode alike), hashed with BLAKE2b-64 and masked to 63 bits
    so the seed fits a signed 64-bit int (torch, numpy and vLLM all accept it).
    """
    if not isinstance(prompt_id, str):
        raise TypeError(f"prompt_id must be a str, got {type(prompt_id).__name__}")
    parts = [_DOMAIN, _check_int("run_seed", run_seed), prompt_id, _check_int("epoch", epoch),
             _check_int("step", step), _check_int("sample_index", sample_index)]
    payload = json.dumps(parts, ensure_ascii=True, separators=(",", ":")).encode("ascii")
    digest = hashlib.blake2b(payload, digest_size=8).digest()
    return int.from_bytes(digest, "big") & ((1 << SEED_BITS) - 1)
