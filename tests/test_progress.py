"""Progress bars: one per phase with an ETA on a terminal (or when forced), none in a log file."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers.engine import TINY


def test_logs_of_non_interactive_runs_have_no_bar_redraws(tiny_run) -> None:
    """The fixture's train and eval ran with stdout/stderr to pipes: their lines, no bars."""
    logs = tiny_run["logs"]
    assert "step 2 | reward" in logs and "[2/2] hello-file#" in logs  # trials finish in any order
    assert "\r" not in logs and "it/s" not in logs and "step/s" not in logs


def test_forced_bars_show_each_phase_with_its_eta(tiny_run, tmp_path) -> None:
    env = {**os.environ, "TINKRL_HOME": str(tiny_run["home"]), "TINKRL_PROGRESS": "1"}
    cmd = [sys.executable, "-m", "tinkrl.cli", "train", "env=arithmetic", f"model_name={TINY}", "batch_size=8"]
    cmd += ["group_size=4", "max_tokens=8", "eval_problems=0", "max_steps=2", f"log_path={tmp_path / 'run'}"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    bars = done.stderr
    assert "sample step 0:   0%" in bars and "sample step 1:" in bars and "group/s" in bars  # groups rolled out
    assert "train: 100%" in bars and "2/2" in bars and "<" in bars  # training steps with elapsed<remaining
