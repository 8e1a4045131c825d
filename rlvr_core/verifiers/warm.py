"""Warm math-verify and sympy up in the pool's forkserver, so every worker forked from it starts warm.

Imported (via `multiprocessing`'s forkserver preload) only in the pool's forkserver process. A
fresh process verifies MATH-style answers about twice as slowly as one that has verified a few
hundred: the LaTeX grammar, sympy's caches and its lazily imported submodules are built on first
use. A worker killed on a hang takes its warm state with it; without this its replacement starts
cold and the rest of the batch slows down (docs/benchmarks/verifiers.md). Forked children inherit
the server's memory, so the warm-up is paid once per parent process, not per worker.

The examples are generic answer shapes (integers, fractions, radicals, π, intervals, tuples,
matrices, sets, degrees, percentages, text), not benchmark data.
"""

from __future__ import annotations

_EXAMPLES = [
    ("\\frac{1}{2}", "0.5"), ("\\dfrac{3}{4}", "\\frac{6}{8}"), ("2\\sqrt{3}", "\\sqrt{12}"),
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"), ("3\\pi", "3\\pi"), ("\\frac{\\pi}{6}", "30^\\circ"),
    ("(-\\infty, 2]", "(-\\infty,2]"), ("[0,1)", "[0, 1)"), ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi/2)"),
    ("\\{1, 2, 3\\}", "1,2,3"), ("x^2 + 2x + 1", "(x+1)^2"), ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}",
    "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"), ("10\\%", "10"), ("27", "27.0"), ("-\\frac{7}{3}", "-7/3"),
    ("\\text{(C)}", "C"), ("5\\sqrt{2}+1", "1+5\\sqrt{2}"), ("e^{i\\pi}", "-1"), ("\\log_2 8", "3"),
    ("1,000", "1000"), ("\\$18", "18"), ("2^{10}", "1024"), ("\\binom{5}{2}", "10"), ("4!", "24"),
    ("y = 2x + 3", "2x+3"), ("\\sin x", "\\sin(x)"), ("\\infty", "\\infty"), ("i", "i"), ("a+b", "b+a"),
]


def warm_up() -> None:
    """Verify each example both ways, as the pool's workers will (errors are irrelevant here)."""
    from rlvr_core.verifiers.base import get_verifier, safe_verify

    verifier = get_verifier("math")
    for gold, answer in _EXAMPLES:
        safe_verify(verifier, f"The answer is $\\boxed{{{answer}}}$.", gold)
        safe_verify(verifier, f"So we get ${answer}$.", gold)


warm_up()
