"""Fixtures shared by the test modules."""

from pathlib import Path

import pytest
from engine_helpers import real_models_dir


@pytest.fixture
def isolated_home(tmp_path, monkeypatch) -> Path:
    """A fresh $TINKRL_HOME for checkpoints, sharing the real model cache (no re-dequantising)."""
    models = real_models_dir()
    home = tmp_path / "tinkrl_home"
    home.mkdir()
    (home / "models").symlink_to(models, target_is_directory=True)
    monkeypatch.setenv("TINKRL_HOME", str(home))
    return home
