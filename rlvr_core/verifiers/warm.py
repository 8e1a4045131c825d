"""Warm every registered verifier up in the pool's forkserver, so every worker forked from it starts warm.

Imported (via `multiprocessing`'s forkserver preload) only in the pool's forkserver process; each
verifier declares what to load in its own `warm_up()` (`Verifier` in base.py). Measured costs of a cold
process (docs/benchmarks/verifiers.md): math-verify verifies MATH-style answers about twice as slowly
until its LaTeX grammar, sympy's caches and lazily imported submodules are built; the first langdetect
call (ifeval's `language:response_language`) loads its profiles, ~0.35 s of CPU. Forked children
inherit the server's memory, so the warm-up is paid once per parent process, not per worker; workers
still call `warm_up()` themselves before they report ready (cheap once warm), which covers verifiers
registered after the forkserver started.

`MATH_EXAMPLES` are generic answer shapes (integers, fractions, radicals, π, intervals, tuples, matrices,
sets, degrees, percentages, text), not benchmark data.
"""

from __future__ import annotations

MATH_EXAMPLES = [
    ("\\frac{1}{2}", "0.5"), ("\\dfrac{3}{4}", "\\frac{6}{8}"), ("2\\sqrt{3}", "\\sqrt{12}"),
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"), ("3\\pi", "3\\pi"), ("\\frac{\\pi}{6}", "30^\\circ"),
    ("(-\\infty, 2]", "(-\\infty,2]"), ("[0,1)", "[0, 1)"), ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi/2)"),
    ("\\{1, 2, 3\\}", "1,2,3"), ("x^2 + 2x + 1", "(x+1)^2"), ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}",
    "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"), ("10\\%", "10"), ("27", "27.0"), ("-\\frac{7}{3}", "-7/3"),
    ("\\text{(C)}", "C"), ("5\\sqrt{2}+1", "1+5\\sqrt{2}"), ("e^{i\\pi}", "-1"), ("\\log_2 8", "3"),
    ("1,000", "1000"), ("\\$18", "18"), ("2^{10}", "1024"), ("\\binom{5}{2}", "10"), ("4!", "24"),
    ("y = 2x + 3", "2x+3"), ("\\sin x", "\\sin(x)"), ("\\infty", "\\infty"), ("i", "i"), ("a+b", "b+a"),
]


def warm_up_all() -> None:
    """`warm_up()` of every registered verifier built with its default options; one that fails to build
    or warm here (a missing optional dependency) is simply left cold: its workers report the problem."""
    from rlvr_core.verifiers.base import get_verifier, known_verifiers

    for name in known_verifiers():
        try:
            get_verifier(name).warm_up()
        except Exception:  # noqa: BLE001 — see the docstring
            pass


warm_up_all()
