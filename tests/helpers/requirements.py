"""Tests that need a system tool `make install` provides (bubblewrap, podman, a C compiler).

Where a tool is missing the test is skipped with the reason (`make test` prints it). With
TINKRL_TESTS_REQUIRE_TOOLS=1 (set by `.ci/run`) nothing is skipped for a missing tool: the
test runs and fails, so CI cannot pass by skipping what a broken install left out.
"""

from __future__ import annotations

import os
import shutil

import pytest

STRICT = os.environ.get("TINKRL_TESTS_REQUIRE_TOOLS") == "1"


def needs(tool: str, purpose: str) -> pytest.MarkDecorator:
    """Skip (outside CI) when `tool` is not on PATH."""
    missing = shutil.which(tool) is None and not STRICT
    return pytest.mark.skipif(missing, reason=f"{tool} is not installed ({purpose}; `make install` installs it)")


def unless(reason: str | None) -> pytest.MarkDecorator:
    """Skip (outside CI) when `reason` says why the tests cannot run here."""
    return pytest.mark.skipif(reason is not None and not STRICT, reason=str(reason))


def skip_module_unless(reason: str | None) -> None:
    """At module level: skip the whole module (outside CI) when `reason` is not None."""
    if reason is not None and not STRICT:
        pytest.skip(reason, allow_module_level=True)


needs_bwrap = needs("bwrap", "the bubblewrap sandbox")
