"""`tinkrl train` end to end on the tiny model: the run directory's files and their contents, the
final sampler checkpoint loading into a fresh ServiceClient, the learning-rate schedule as applied,
and resuming after a SIGKILL with no duplicated or missing step in metrics.jsonl."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers.engine import TINY, real_models_dir
from tinker import types

from tinkrl.local.compute_plan import AGREEMENT_BOUND

ARGS = [
    "env=arithmetic",
    f"model_name={TINY}",
    "batch_size=8",
    "group_size=4",
    "max_tokens=8",
    "eval_problems=4",
    "save_every=1",
]


@pytest.fixture
def home(tmp_path):
    h = tmp_path / "home"
    h.mkdir()
    (h / "models").symlink_to(real_models_dir(), target_is_directory=True)
    return h


def train(home: Path, cwd: Path, *argv: str, wait: bool = True):
    env = {**os.environ, "TINKRL_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "tinkrl.cli", "train", *ARGS, *argv]
    if not wait:
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_train_smoke(home, tmp_path, monkeypatch):
    run = tmp_path / "run"
    out = train(home, tmp_path, "max_steps=2", "eval_every=1", f"log_path={run}")
    assert out.returncode == 0, out.stdout + out.stderr
    # the run says how the engine computes: the sampler precision the tests pin (conftest), on CPU
    assert f"run {run}: {TINY} on local (cpu, " in out.stdout and ", sampler matched)" in out.stdout, out.stdout

    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["model_name"] == TINY and config["max_steps"] == 2 and "arithmetic" in config["environments"]

    metrics = rows(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1]
    for m in metrics:
        for key in (
            "env/all/reward/total",
            "env/arithmetic/reward/total",
            "optim/kl_sample_train_v1",
            "optim/entropy",
            "optim/grad_norm",
            "eval/arithmetic/greedy_reward",
            "time/step",
        ):
            assert key in m, key
        assert m["env/all/total_episodes"] == 8
    # the sampler and the trainer agree on step 0 (same weights): their KL estimate is ~0, and the
    # reported mismatch is within the bound every default precision keeps
    assert abs(metrics[0]["optim/kl_sample_train_v1"]) < 1e-3
    assert 0 <= metrics[0]["optim/dlogprob_mean"] <= metrics[0]["optim/dlogprob_max"] <= AGREEMENT_BOUND
    assert metrics[0]["optim/action_tokens"] > 0

    ckpts = rows(run / "checkpoints.jsonl")
    assert [c["batch"] for c in ckpts] == [1, 2] and ckpts[-1]["name"] == "final"
    for c in ckpts:
        assert set(c) >= {"name", "batch", "state_path", "sampler_path"}
        assert c["state_path"].startswith("tinker://") and "/weights/" in c["state_path"]
        assert "/sampler_weights/" in c["sampler_path"]

    rollouts = rows(run / "rollouts" / "step_000000.jsonl")
    assert len(rollouts) == 8
    r = rollouts[0]
    assert {"prompt", "response", "tokens", "mask", "reward", "advantage"} <= set(r)
    assert len(r["tokens"]) == len(r["mask"]) and sum(r["mask"]) == 8  # max_tokens sampled tokens trained

    # the final sampler checkpoint loads into a fresh ServiceClient (resolved through TINKRL_HOME)
    monkeypatch.setenv("TINKRL_HOME", str(home))
    from tinkrl.local import ServiceClient

    sc = ServiceClient().create_sampling_client(model_path=ckpts[-1]["sampler_path"])
    resp = sc.sample(
        types.ModelInput.from_ints(r["tokens"][:10]), 1, types.SamplingParams(max_tokens=4, seed=0)
    ).result()
    assert len(resp.sequences[0].tokens) == 4 and np.all(np.asarray(resp.sequences[0].logprobs) <= 0)


def test_train_applies_the_lr_schedule(home, tmp_path):
    run = tmp_path / "run"
    argv = ["max_steps=4", "eval_every=0", "eval_problems=0", "save_every=0", "lr_schedule=linear"]
    out = train(home, tmp_path, *argv, "learning_rate=1e-3", f"log_path={run}")
    assert out.returncode == 0, out.stdout + out.stderr
    metrics = rows(run / "metrics.jsonl")
    lrs = [m["optim/lr"] for m in metrics]
    assert lrs == pytest.approx([1e-3, 7.5e-4, 5e-4, 2.5e-4])
    # what the optimizer applied (the engine's optim_step reports it), not only what was logged
    assert [m["optim/learning_rate"] for m in metrics] == pytest.approx(lrs)


def run_and_kill(home, cwd, argv, ckpt_file: Path, until, must_kill: bool) -> str:
    """Start a run, SIGKILL it as soon as checkpoints.jsonl satisfies `until(rows)`; returns its output."""
    proc = train(home, cwd, *argv, wait=False)
    deadline = time.time() + 240
    try:
        while time.time() < deadline and proc.poll() is None:
            if ckpt_file.is_file() and until(rows(ckpt_file)):
                break
            time.sleep(0.01)
        if must_kill:
            assert proc.poll() is None, "the run ended before it could be killed:\n" + proc.stdout.read()
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    return proc.stdout.read()


def test_resume_after_sigkill(home, tmp_path):
    run = tmp_path / "run"
    steps = 5
    argv = [f"max_steps={steps}", "eval_every=0", f"log_path={run}"]
    ckpt_file = run / "checkpoints.jsonl"
    # killed right after its first checkpoint
    run_and_kill(home, tmp_path, argv, ckpt_file, lambda r: len(r) >= 1, must_kill=True)
    killed_at = rows(ckpt_file)[-1]["batch"]
    assert killed_at < steps
    # resumed, then killed the moment its final checkpoint is recorded (during the final eval, if
    # the checkpoint were recorded before the step's metrics line, that line would be lost)
    second = run_and_kill(home, tmp_path, argv, ckpt_file, lambda r: r[-1]["batch"] == steps, must_kill=False)
    assert f"resuming {run} from checkpoint" in second and f"(step {killed_at})" in second
    assert f"steps {killed_at}..{steps}" in second
    out = train(home, tmp_path, *argv)
    assert out.returncode == 0, out.stdout + out.stderr
    metric_steps = [m["step"] for m in rows(run / "metrics.jsonl")]
    assert metric_steps == list(range(steps)), metric_steps  # no duplicated, no missing step
    ckpts = rows(ckpt_file)
    assert ckpts[-1]["batch"] == steps and ckpts[-1]["name"] == "final"
    assert sorted({c["batch"] for c in ckpts}) == list(range(1, steps + 1))
    assert any(c["batch"] == killed_at for c in ckpts)


def test_prepare_runs_one_step_and_leaves_no_run(home, tmp_path):
    """`--prepare` runs one step of the job in a scratch directory (what the model's files, the kernels and
    the compile cache keep is what it is for; `compile_cache_dir` is tested in test_engine.py): no run
    directory and no checkpoint are left behind, and it excludes `--dry-run`."""
    out = train(home, tmp_path, "run_name=job", "--prepare")
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"prepared {TINY} for this job" in out.stdout and "step 0 |" in out.stdout
    assert not (tmp_path / "runs").exists()
    checkpoints = home / "checkpoints"
    assert not checkpoints.exists() or not any(checkpoints.iterdir())
    both = train(home, tmp_path, "--prepare", "--dry-run")
    assert both.returncode == 2 and "--dry-run and --prepare exclude each other" in both.stderr
