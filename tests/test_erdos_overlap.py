"""C₅ from tinkrl against closed-form values, independent computations and a published construction."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from tinkrl.envs.erdos import overlap as em
from tinkrl.envs.erdos.runner import score_values

HAUGLAND_51 = Path(__file__).parent / "data" / "erdos_haugland_51.json"


def overlap_at_shift(h: list[Fraction], t: Fraction) -> Fraction:
    """∫ h(x)·(1 − h(x + t)) dx over x, x + t ∈ [0, 2], by exact piecewise integration.

    Written independently of tinkrl: it merges the breakpoints of h(x) and of h(x + t) and
    integrates the piecewise-constant product cell by cell, for any rational shift t.
    """
    n = len(h)
    dx = Fraction(2, n)
    lo, hi = max(Fraction(0), -t), min(Fraction(2), 2 - t)
    if lo >= hi:
        return Fraction(0)
    points = {lo, hi}
    for i in range(n + 1):
        for p in (i * dx, i * dx - t):
            if lo < p < hi:
                points.add(p)
    pts = sorted(points)
    total = Fraction(0)
    for a, b in zip(pts, pts[1:]):
        mid = (a + b) / 2
        i, j = int(mid / dx), int((mid + t) / dx)
        total += (b - a) * h[i] * (1 - h[j])
    return total


def test_constant_half_is_one_half():
    # h ≡ 1/2: the overlap at shift k is (2 − |k|)/4, largest at k = 0.
    h = np.full(200, 0.5)
    assert em.c5(h) == pytest.approx(0.5, abs=1e-15)
    assert em.c5_exact(h) == Fraction(1, 2)


def test_two_step_function_is_four_ninths():
    # h = a on [0,1), 1 − a on [1,2): overlaps 2a(1−a) at k=0, a² at k=±1; a = 2/3 gives 4/9.
    n = 120
    h = np.concatenate([np.full(n // 2, 2 / 3), np.full(n // 2, 1 / 3)])
    assert em.c5(h) == pytest.approx(4 / 9, abs=1e-14)
    assert float(em.c5_exact(h)) == pytest.approx(4 / 9, abs=1e-14)
    # With the exact thirds the independent integrator gives exactly 4/9 at shift 0 and shift 1.
    hq = [Fraction(2, 3)] * (n // 2) + [Fraction(1, 3)] * (n // 2)
    assert overlap_at_shift(hq, Fraction(0)) == Fraction(4, 9)
    assert overlap_at_shift(hq, Fraction(1)) == Fraction(4, 9)
    assert overlap_at_shift(hq, Fraction(-1)) == Fraction(1, 9)


def test_float_and_exact_agree_on_random_constructions():
    rng = np.random.default_rng(0)
    for n in (7, 50, 200):
        h = em.random_construction(n, rng)
        assert em.c5(h) == pytest.approx(float(em.c5_exact(h)), abs=1e-13)


def test_grid_maximum_is_the_maximum_over_all_real_shifts():
    rng = np.random.default_rng(1)
    n = 12
    h = [Fraction(float(v)) for v in em.random_construction(n, rng)]
    dx = Fraction(2, n)
    grid = [overlap_at_shift(h, j * dx) for j in range(-n + 1, n)]
    # Independent integrator at grid shifts == tinkrl's exact grid overlaps.
    assert max(grid) == em.c5_exact([float(v) for v in h])
    # Between grid points the overlap is the linear interpolation, never above the grid max.
    for j in range(-n + 1, n - 1):
        for theta in (Fraction(1, 7), Fraction(1, 2), Fraction(5, 6)):
            t = (j + theta) * dx
            value = overlap_at_shift(h, t)
            assert value == (1 - theta) * grid[j + n - 1] + theta * grid[j + n]
            assert value <= max(grid)


@pytest.mark.parametrize(
    "values, reason",
    [
        (np.r_[np.full(99, 0.5), np.nan], em.NOT_FINITE),
        (np.r_[np.full(99, 0.5), np.inf], em.NOT_FINITE),
        (np.r_[np.full(98, 0.5), 1.2, -0.2], em.OUT_OF_RANGE),
        (np.full(99, 50 / 99), em.WRONG_LENGTH),
        (np.full(100, 0.45), em.WRONG_INTEGRAL),
        (np.full((10, 10), 0.5), em.WRONG_SHAPE),
        (["a"] * 100, em.WRONG_SHAPE),
        # Integral 1 − 1e-7: within tolerance, normalised back to exactly 1 (values stay ≤ 1).
        (np.r_[np.ones(50), np.zeros(50)] * (1 - 1e-7), None),
        # Integral 1 − 2e-7 within tolerance, but normalising pushes the 1.0 values above 1.
        (np.r_[np.ones(49), 1 - 1e-5, np.zeros(50)], em.OUT_OF_RANGE),
    ],
)
def test_invalid_constructions_are_rejected_with_their_reason(values, reason):
    result = em.validate(values, 100)
    if reason is None:
        assert result.valid and result.h.max() <= 1.0
        assert float(result.h.sum()) * 2 / 100 == pytest.approx(1.0, abs=1e-14)
    else:
        assert not result.valid
        assert result.reason == reason, result.detail
        assert result.detail


def test_valid_construction_is_normalised_and_rewarded_by_inverse_c5():
    h = np.full(100, 0.5) * (1 + 5e-7)
    result = em.validate(h, 100)
    assert result.valid
    assert float(np.sum(result.h)) == pytest.approx(50.0, abs=1e-12)
    assert em.reward_for(em.c5(result.h)) == pytest.approx(2.0)
    assert em.reward_for(None) == 0.0


def published_construction(path: Path) -> tuple[dict, list[Fraction]]:
    """The fixture's metadata and its full step values as the exact printed decimals."""
    data = json.loads(path.read_text(), parse_float=Fraction)
    left = [Fraction(v) for v in data["left_half"]]
    return data, left + left[-2::-1]  # symmetric about x = 1; the central step appears once


def test_published_haugland_51_step_function_gives_its_stated_value():
    data, values = published_construction(HAUGLAND_51)
    n = data["n_steps"]
    assert len(values) == n == 51
    # As printed, the construction is admissible exactly: values in [0, 1], integral exactly 1.
    assert all(0 <= v <= 1 for v in values)
    assert sum(values) * Fraction(2, n) == 1
    stated = Fraction(data["stated_c5"])
    half_unit = Fraction(1, 2 * 10 ** data["stated_digits"])

    # Exact C5 of the printed decimals (independent integrator, every grid shift) rounds to the
    # stated 16 digits.
    dx = Fraction(2, n)
    exact = max(overlap_at_shift(values, j * dx) for j in range(-n + 1, n))
    assert abs(exact - stated) <= half_unit, float(exact)

    # Scored the way the environment scores a program's h: validation, normalisation, float C5.
    outcome = score_values([float(v) for v in values], n, integral_tol=1e-6)
    assert outcome.valid, outcome.detail
    assert outcome.c5 == pytest.approx(float(stated), abs=1e-15)
    # tinkrl's own exact computation on the same floats agrees with its float one and the above.
    assert outcome.h is not None
    assert float(em.c5_exact(outcome.h)) == pytest.approx(outcome.c5, abs=1e-15)
    assert float(em.c5_exact(outcome.h)) == pytest.approx(float(exact), abs=1e-15)
