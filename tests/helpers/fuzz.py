"""Shared settings of the fuzz tests: a fast, deterministic slice for `make test` and long rounds (`slow`).

Each fuzz target is one function checking one generated input; `fuzz_pair` makes it two tests: the
fast one draws a fixed set of examples (derandomized, so the same examples every run and no example
database), the long one draws many, from fresh randomness. A failure prints the shrunk input, which
then becomes an ordinary example-based test beside the fix.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis.strategies import SearchStrategy

FAST = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=40,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
LONG = settings(FAST, derandomize=False, max_examples=3000)


def fuzz_pair(
    check: Callable[..., None], *strategies: SearchStrategy, fast: int = 40, long: int = 3000
) -> tuple[Callable, Callable]:
    """(the fast test, the long `slow` test) of `check` over inputs drawn from `strategies`."""
    quick = settings(FAST, max_examples=fast)(given(*strategies)(check))
    thorough = pytest.mark.slow(settings(LONG, max_examples=long)(given(*strategies)(check)))
    return quick, thorough
