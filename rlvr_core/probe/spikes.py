"""Spikes in a per-token KL sequence, and turning points of a trajectory across checkpoints.

Spike rule (`SpikeRule`), applied to one response's per-token values x_1..x_T (by default kl_ba):

  * ``robust`` (default): x_t is a spike when x_t > median(x) + z * 1.4826 * MAD(x) and x_t >= min_value
    (MAD = median |x - median(x)|; 1.4826 * MAD estimates the standard deviation of normal data). The
    median and MAD ignore the spikes themselves, so a change that touches a large share of the tokens
    (up to half) still stands out; the mean/std rule below is masked by it (a token type that is 40% of
    the tokens and shifted by the same amount inflates the std until nothing exceeds mean + 3 std).
  * ``zscore``: x_t > mean(x) + z * std(x) (population std) and x_t >= min_value: the classic rule, for
    comparison with reports that used it; fine when spikes are rare.
  * ``absolute``: x_t > threshold.

For ``robust`` and ``zscore`` the centre and scale come from the same response (``scope="sequence"``) or
from every scored token of the checkpoint (``scope="checkpoint"``, so a uniformly shifted response is all
spikes). Defaults z = 3, min_value = 1e-3 nats: a flat near-zero sequence (identical models: every value
0, MAD 0) has no spikes, and rounding noise never makes one.
The comparison is strict, so a constant sequence never spikes under ``zscore``.

Turning points (`turning_points`) of a trajectory (step_i, v_i), i = 1..n, ordered by step: with first
differences d_i = v_{i+1} - v_i, a difference counts as flat when |d_i| <= rel_tol * (max v - min v).
Interior point i is a ``peak`` when the last non-flat difference before it is > 0 and the next non-flat
one after it is < 0 (and the point is not inside a flat stretch), a ``trough`` for the reverse. Otherwise
it is an ``inflection`` when the trend has one direction on both sides (d_{i-1}, d_i same non-flat sign)
and the curvature changes sign at i: c_{i-1} = d_{i-1} - d_{i-2} and c_i = d_i - d_{i-1} are both beyond
the tolerance and of opposite signs (the rise or fall goes from accelerating to slowing down, or back).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

__all__ = ["SpikeRule", "detect_spikes", "centre_scale", "pooled_moments", "turning_points"]


@dataclass(frozen=True)
class SpikeRule:
    """How a token is marked as a spike; see the module docstring."""

    kind: Literal["robust", "zscore", "absolute"] = "robust"
    z: float = 3.0
    min_value: float = 1e-3
    threshold: float = 0.1
    scope: Literal["sequence", "checkpoint"] = "sequence"

    def __post_init__(self) -> None:
        if self.kind not in ("robust", "zscore", "absolute"):
            raise ValueError(f"spike rule kind must be 'robust', 'zscore' or 'absolute', got {self.kind!r}")
        if self.scope not in ("sequence", "checkpoint"):
            raise ValueError(f"spike rule scope must be 'sequence' or 'checkpoint', got {self.scope!r}")
        if self.z < 0 or self.min_value < 0:
            raise ValueError("z and min_value must be >= 0")

    def describe(self) -> str:
        if self.kind == "absolute":
            return f"value > {self.threshold:g}"
        over = "the response" if self.scope == "sequence" else "all tokens of the checkpoint"
        centre = "median + {z}·1.4826·MAD" if self.kind == "robust" else "mean + {z}·std"
        return f"value > {centre.format(z=f'{self.z:g}')} (over {over}) and value ≥ {self.min_value:g}"


def detect_spikes(values: Sequence[float] | np.ndarray, rule: SpikeRule = SpikeRule(), *,
                  pooled: tuple[float, float] | None = None) -> np.ndarray:
    """Boolean mask (T,) of spikes in one response's values (T,).

    pooled: (centre, scale) over the checkpoint, required for scope="checkpoint" (see `pooled_moments`).
    """
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return np.zeros(0, dtype=bool)
    if rule.kind == "absolute":
        return x > rule.threshold
    if rule.scope == "checkpoint":
        if pooled is None:
            raise ValueError("scope='checkpoint' needs the pooled (centre, scale) of the checkpoint's tokens")
        centre, scale = pooled
    else:
        centre, scale = centre_scale(x, rule.kind)
    return (x > centre + rule.z * scale) & (x >= rule.min_value)


def centre_scale(x: np.ndarray, kind: str) -> tuple[float, float]:
    """(median, 1.4826 * MAD) for kind "robust", (mean, population std) for "zscore"."""
    if kind == "robust":
        med = float(np.median(x))
        return med, 1.4826 * float(np.median(np.abs(x - med)))
    return float(x.mean()), float(x.std())


def pooled_moments(arrays: Sequence[np.ndarray], kind: str = "robust") -> tuple[float, float]:
    """`centre_scale` over the concatenation of the arrays."""
    x = np.concatenate([np.asarray(a, dtype=np.float64) for a in arrays]) if arrays else np.zeros(0)
    return centre_scale(x, kind) if x.size else (0.0, 0.0)


def turning_points(steps: Sequence[float], values: Sequence[float], *, rel_tol: float = 0.05) -> list[dict]:
    """[{step, value, kind}] for the interior points of the trajectory where the trend changes (see above)."""
    order = np.argsort(np.asarray(steps, dtype=np.float64), kind="stable")
    s = np.asarray(steps, dtype=np.float64)[order]
    v = np.asarray(values, dtype=np.float64)[order]
    n = len(v)
    if n < 3:
        return []
    tol = rel_tol * float(v.max() - v.min())
    d = np.diff(v)                                    # d[i] = v[i+1] - v[i]
    sign = np.where(np.abs(d) <= tol, 0.0, np.sign(d))
    curv = np.diff(d)                                 # curv[i-1] = d[i] - d[i-1]: curvature at point i
    out = []
    for i in range(1, n - 1):
        before = next((sign[j] for j in range(i - 1, -1, -1) if sign[j] != 0), 0.0)
        after = next((sign[j] for j in range(i, n - 1) if sign[j] != 0), 0.0)
        kind = None
        if sign[i - 1] != 0 or sign[i] != 0:          # a point inside a flat stretch is not a turn
            if before > 0 and after < 0:
                kind = "peak"
            elif before < 0 and after > 0:
                kind = "trough"
        if kind is None and i >= 2 and sign[i - 1] == sign[i] != 0:
            c_prev, c_here = curv[i - 2], curv[i - 1]
            if abs(c_prev) > tol and abs(c_here) > tol and np.sign(c_prev) != np.sign(c_here):
                kind = "inflection"
        if kind:
            out.append({"step": s[i].item(), "value": float(v[i]), "kind": kind})
    return out
