"""Fixtures of the reliability sweep (its shared code is in tests/helpers/chaos.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.engine import real_models_dir


@pytest.fixture
def home(tmp_path) -> Path:
    """A fresh $TINKRL_HOME (checkpoints) that shares the real model cache."""
    h = tmp_path / "home"
    h.mkdir()
    (h / "models").symlink_to(real_models_dir(), target_is_directory=True)
    return h
