"""Small statistics every reported number needs: a Wilson interval carries n with the accuracy.

Wilson rather than the normal approximation because eval sets are small and accuracies near 0 or 1
are common (the normal interval then leaves [0, 1] or collapses to a point; BUGZOO G-small-eval).
"""

from __future__ import annotations

import math


def wilson_interval(successes: float, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion; (0, 1) when n = 0. Default z is 95%."""
    if n <= 0:
        return (0.0, 1.0)
    if not 0 <= successes <= n:
        raise ValueError(f"successes={successes} outside [0, n={n}]")
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))
