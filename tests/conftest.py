"""Fixtures shared by the test modules (their helpers live in tests/helpers/)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.engine import real_models_dir


@pytest.fixture
def isolated_home(tmp_path, monkeypatch) -> Path:
    """A fresh $TINKRL_HOME for checkpoints, sharing the real model cache (no re-dequantising)."""
    models = real_models_dir()
    home = tmp_path / "tinkrl_home"
    home.mkdir()
    (home / "models").symlink_to(models, target_is_directory=True)
    monkeypatch.setenv("TINKRL_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def renderer():
    """The chat renderer of the tiny random-weight test model (tests of one family override it)."""
    from tinkrl.local.models import TINY_MODEL, load_tokenizer
    from tinkrl.renderers import get_renderer

    return get_renderer(load_tokenizer(TINY_MODEL), TINY_MODEL)


@pytest.fixture(scope="session")
def bwrap_provider():
    """One bubblewrap sandbox provider for the whole session."""
    from tinkrl.sandbox import get_provider

    provider = get_provider("bwrap")
    yield provider
    provider.close()
