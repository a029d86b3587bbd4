"""tinker-cookbook's math_rl recipe, unmodified but for base_url, against `tinkrl serve tinker`.

Slow and opt-in: the cookbook needs its own virtualenv (see bench/cookbook_rl.sh, which
creates it on first run); the test is skipped when that virtualenv is absent.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("COOKBOOK_VENV", Path.home() / ".cache/tinkrl/cookbook-venv"))


@pytest.mark.slow
@pytest.mark.skipif(
    not (VENV / "bin/python").exists(), reason=f"no cookbook venv at {VENV}: run bench/cookbook_rl.sh once"
)
def test_cookbook_math_rl_recipe_trains_against_the_server(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log_path = tmp_path / "cookbook"
    env = dict(os.environ, COOKBOOK_VENV=str(VENV), PORT=str(port), STEPS="2", LOG_PATH=str(log_path))
    done = subprocess.run(
        ["bash", "bench/cookbook_rl.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    steps = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]
    assert [s["progress/batch"] for s in steps] == [0, 1]
    assert all("optim/kl_sample_train_v1" in s for s in steps)  # trained on its own samples
    checkpoint = json.loads((log_path / "checkpoints.jsonl").read_text().splitlines()[-1])
    assert checkpoint["state_path"].startswith("tinker://")
