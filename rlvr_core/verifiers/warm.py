"""Warm the pool's verifier up in the pool's forkserver, so every worker forked from it starts warm.

Imported (via `multiprocessing`'s forkserver preload) only in the pool's forkserver process. The pool that
starts the forkserver names its verifier in `WARM_ENV` (`rlvr_core.verifiers.pool`), and only that one is
warmed: warming every registered verifier cost seconds (math-verify's grammar, sympy, langdetect's profiles)
that a pool of another verifier never uses. Without the variable (a forkserver someone else started) every
registered verifier is warmed. Each verifier declares what to load in its own `warm_up()` (`Verifier` in
base.py). Measured costs of a cold process (docs/benchmarks/verifiers.md): math-verify verifies MATH-style
answers about twice as slowly until its LaTeX grammar, sympy's caches and lazily imported submodules are
built; the first langdetect call (ifeval's `language:response_language`) loads its profiles, ~0.35 s of CPU.
Forked children inherit the server's memory, so the warm-up is paid once per parent process, not per worker;
workers still call `warm_up()` themselves before they report ready (cheap once warm), which covers the
verifiers of later pools of the same process, which share this forkserver.
"""

from __future__ import annotations

import os
import sys

from rlvr_core.verifiers.pool import WARM_ENV, WARM_PATH_ENV  # names (comma-separated), the parent's sys.path
from rlvr_core.verifiers.registry import get_verifier, known_verifiers

# What this process warmed, in order (read by tests through a worker forked from it).
WARMED: list[str] = []


def to_warm() -> list[str]:
    """The verifiers `WARM_ENV` names, else every registered one."""
    named = [n for n in os.environ.get(WARM_ENV, "").split(",") if n]
    return named or known_verifiers()


def warm_up(names: list[str]) -> None:
    """`warm_up()` of each verifier built with its default options; one that fails to build or warm here (a
    missing optional dependency) is simply left cold: its workers report the problem."""
    for name in names:
        try:
            get_verifier(name).warm_up()
        except Exception:  # noqa: BLE001 — see the docstring
            continue
        WARMED.append(name)


if os.environ.get(WARM_PATH_ENV):  # so that a `package.module:name` verifier imports here as in the parent
    sys.path[:] = os.environ[WARM_PATH_ENV].split(os.pathsep)
warm_up(to_warm())
