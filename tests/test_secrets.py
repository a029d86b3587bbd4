"""No secret a run is given ends up in what it leaves: every credential tinkrl reads set to a marked
value, a real `tinkrl train` (W&B offline, Docent export to files, a checkpoint) and a `tinkrl eval`,
then every file under their directories (and W&B's own logs) and everything they printed searched
for the mark."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers.engine import TINY, real_models_dir

MARK = "s3cr3tMARKq7"
SECRETS = {
    "TINKER_API_KEY": f"tml-{MARK}tinker",
    "WANDB_API_KEY": f"{MARK}wandb".ljust(40, "x"),
    "OPENAI_API_KEY": f"sk-{MARK}openai",
    "OPENREWARD_API_KEY": f"{MARK}openreward",
    "TINKRL_API_KEY": f"tml-{MARK}server",
    "TINKRL_ADMIN_KEY": f"{MARK}admin",
    "HF_TOKEN": f"hf_{MARK}hub",
}


def files_holding(root: Path, text: str) -> list[str]:
    """The files under `root` whose bytes contain `text`."""
    return [
        str(p.relative_to(root)) for p in sorted(root.rglob("*")) if p.is_file() and text.encode() in p.read_bytes()
    ]


def test_no_secret_in_a_runs_files_or_output(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(real_models_dir(), target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if k != "DOCENT_API_KEY"}
    env.update(SECRETS, TINKRL_HOME=str(home), HOME=str(tmp_path), WANDB_MODE="offline", HF_HUB_OFFLINE="1")
    run = tmp_path / "runs" / "marked"
    train = [sys.executable, "-m", "tinkrl.cli", "train", "env=arithmetic", f"model_name={TINY}", "backend=local"]
    train += ["batch_size=4", "group_size=2", "max_tokens=8", "eval_problems=2", "eval_every=1", "max_steps=2"]
    train += [f"log_path={run}", "docent.export_every=1", "wandb.enabled=true", "save_every=1"]
    done = subprocess.run(train, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    printed = done.stdout + done.stderr
    evals = tmp_path / "evals"
    tasks = Path(__file__).resolve().parents[1] / "tasks"
    ev = [sys.executable, "-m", "tinkrl.cli", "eval", "--tasks", str(tasks), "--task-id", "hello-file", "--model", TINY]
    ev += ["--backend", "local", "--n", "1", "--max-turns", "1", "--max-tokens", "8", "--output-path", str(evals)]
    done = subprocess.run(ev, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    printed += done.stdout + done.stderr
    # what a run leaves is there to be searched: the files the claim is about
    for name in ("run.json", "config.yaml", "metrics.jsonl"):
        assert (run / name).is_file(), name
    assert list((run / "episodes").glob("*.jsonl")) and list((run / "docent").glob("*.json"))
    assert list((run / "wandb").rglob("*.wandb")), "W&B (offline) wrote no run file (its config is in it)"
    assert list(evals.rglob("results.json"))
    assert MARK not in printed, [line for line in printed.splitlines() if MARK in line]
    for root in (tmp_path / "runs", evals, tmp_path / ".cache" / "wandb", home):  # home: checkpoints
        assert files_holding(root, MARK) == [], root
