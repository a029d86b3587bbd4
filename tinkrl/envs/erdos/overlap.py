"""Erdős minimum overlap: the C₅ functional, its exact cross-check, and validation of h.

A construction is a step function h on [0, 2] given by `n` values: h[i] is its value on
[i·dx, (i+1)·dx) with dx = 2/n. It must take values in [0, 1] and integrate to 1
(sum(h)·dx = 1). Its bound is

    C₅(h) = max over real shifts k of ∫ h(x) · g(x + k) dx,   g = (1 − h) on [0, 2], 0 outside,

and the Erdős minimum-overlap constant is at most C₅(h) for every such h.

Why the grid maximum is exact: for a shift k = (j + θ)·dx with 0 ≤ θ ≤ 1, every cell of h
overlaps one cell of g over (1 − θ)·dx and the next over θ·dx, so the overlap is the linear
interpolation (1 − θ)·O_j + θ·O_{j+1} of the grid overlaps O_j = dx · Σ_i h[i]·g[i + j].
A piecewise-linear function peaks at a breakpoint, so max_j O_j is the true maximum.

tinkrl computes C₅ only from h itself, never from a number the model's code reports
(the published harness trusted the reported value within 1e-4, more than the record's margin).
`c5_exact` recomputes the same maximum in exact rational arithmetic for certificates and tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

# Why a construction is rejected (reward 0). Execution problems live in runner.py.
WRONG_SHAPE = "wrong_shape"  # not a flat sequence of numbers
WRONG_LENGTH = "wrong_length"  # not n_points values
NOT_FINITE = "not_finite"  # NaN or ±inf
OUT_OF_RANGE = "out_of_range"  # a value outside [0, 1] (before or after normalising the integral)
WRONG_INTEGRAL = "wrong_integral"  # ∫h differs from 1 by more than the tolerance

# Values this far outside [0, 1] after normalising the integral are float noise and are clipped.
_RANGE_SLACK = 1e-12


@dataclass
class Validated:
    """The outcome of checking a candidate h: the normalised array, or why it was rejected."""

    h: np.ndarray | None
    reason: str | None = None
    detail: str = ""

    @property
    def valid(self) -> bool:
        return self.h is not None


def overlaps(h: np.ndarray) -> np.ndarray:
    """O_j = dx · Σ_i h[i]·(1 − h[i + j]) for every grid shift j (2n − 1 values)."""
    h = np.asarray(h, dtype=np.float64)
    dx = 2.0 / len(h)
    # np.correlate(a, v)[m] = Σ_i a[i + m − (n − 1)] · v[i]: every relative shift once.
    return np.correlate(h, 1.0 - h, mode="full") * dx


def c5(h: np.ndarray) -> float:
    """C₅(h) in float64 (exact up to rounding, by the grid argument in the module docstring)."""
    return float(np.max(overlaps(h)))


def c5_exact(h: np.ndarray | list[float]) -> Fraction:
    """C₅ of the float values h, computed with exact rational arithmetic.

    Every float is a dyadic rational, so scaling all values by a common power of two makes
    them integers; the overlaps are then exact integer sums. Independent of `overlaps`.
    """
    values = [Fraction(float(v)) for v in h]
    n = len(values)
    denom = 1
    for v in values:
        denom = max(denom, v.denominator)  # powers of two: the largest is a common multiple
    ints = [int(v * denom) for v in values]
    comp = [denom - a for a in ints]  # (1 − h)·denom
    best = None
    for shift in range(-(n - 1), n):
        total = 0
        for i in range(max(0, -shift), min(n, n - shift)):
            total += ints[i] * comp[i + shift]
        if best is None or total > best:
            best = total
    assert best is not None
    return Fraction(best, denom * denom) * Fraction(2, n)


def validate(values: Any, n_points: int, integral_tol: float = 1e-6) -> Validated:
    """Check a candidate h and normalise its integral to exactly 1 (in float64).

    Rejects (with a reason) anything that is not n_points finite numbers in [0, 1] whose
    integral is within `integral_tol` of 1. An accepted h is rescaled by 1/∫h, as the
    published verifier does, and must still lie in [0, 1].
    """
    try:
        h = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError, OverflowError) as exc:
        return Validated(None, WRONG_SHAPE, f"not numeric: {type(exc).__name__}: {exc}"[:200])
    if h.ndim != 1:
        return Validated(None, WRONG_SHAPE, f"expected a 1-D array, got shape {h.shape}")
    if len(h) != n_points:
        return Validated(None, WRONG_LENGTH, f"expected {n_points} values, got {len(h)}")
    if not np.all(np.isfinite(h)):
        bad = int(np.sum(~np.isfinite(h)))
        return Validated(None, NOT_FINITE, f"{bad} value(s) are NaN or infinite")
    lo, hi = float(h.min()), float(h.max())
    if lo < 0.0 or hi > 1.0:
        return Validated(None, OUT_OF_RANGE, f"values must lie in [0, 1]; min {lo:.6g}, max {hi:.6g}")
    integral = float(h.sum()) * 2.0 / n_points
    if not abs(integral - 1.0) <= integral_tol:
        return Validated(
            None,
            WRONG_INTEGRAL,
            f"integral of h is {integral:.9g}, must be 1 (tolerance {integral_tol:g}); sum(h) must be {n_points / 2:g}",
        )
    h = h / integral
    if float(h.max()) > 1.0 + _RANGE_SLACK:
        return Validated(
            None, OUT_OF_RANGE, f"after normalising the integral to 1 the max is {float(h.max()):.12g} > 1"
        )
    return Validated(np.clip(h, 0.0, 1.0))


def reward_for(c5_value: float | None) -> float:
    """Reward = 1/C₅ for a valid construction, 0 otherwise (higher is better)."""
    return 0.0 if c5_value is None or c5_value <= 0 else 1.0 / c5_value


def random_construction(n_points: int, rng: np.random.Generator) -> np.ndarray:
    """A random valid starting point: 0.5 + U(−0.4, 0.4), centred so that ∫h = 1."""
    noise = rng.uniform(-0.4, 0.4, size=n_points)
    h = 0.5 + noise - noise.mean()
    h = np.clip(h, 0.0, 1.0)
    return h * (n_points / 2) / h.sum()
