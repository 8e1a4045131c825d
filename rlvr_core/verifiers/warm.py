"""Warm every registered verifier up in the pool's forkserver, so every worker forked from it starts warm.

Imported (via `multiprocessing`'s forkserver preload) only in the pool's forkserver process; each
verifier declares what to load in its own `warm_up()` (`Verifier` in base.py). Measured costs of a cold
process (docs/benchmarks/verifiers.md): math-verify verifies MATH-style answers about twice as slowly
until its LaTeX grammar, sympy's caches and lazily imported submodules are built; the first langdetect
call (ifeval's `language:response_language`) loads its profiles, ~0.35 s of CPU. Forked children
inherit the server's memory, so the warm-up is paid once per parent process, not per worker; workers
still call `warm_up()` themselves before they report ready (cheap once warm), which covers verifiers
registered after the forkserver started.
"""

from __future__ import annotations

from rlvr_core.verifiers.registry import get_verifier, known_verifiers


def warm_up_all() -> None:
    """`warm_up()` of every registered verifier built with its default options; one that fails to build
    or warm here (a missing optional dependency) is simply left cold: its workers report the problem."""
    for name in known_verifiers():
        try:
            get_verifier(name).warm_up()
        except Exception:  # noqa: BLE001 — see the docstring
            pass


warm_up_all()
