"""Fixtures shared by the test modules (their helpers live in tests/helpers/)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers.engine import real_models_dir

# The engine's tests check its arithmetic exactly (sampled logprobs against forward()'s), so they
# sample with the trainer's own arithmetic on every CPU class, also where the class's default
# sampler is bf16 (CPUs with AMX); the tests of the bf16 sampler and of the defaults ask for it.
os.environ.setdefault("TINKRL_SAMPLER_PRECISION", "matched")


@pytest.fixture
def isolated_home(tmp_path, monkeypatch) -> Path:
    """A fresh $TINKRL_HOME for checkpoints, sharing the real model cache (no re-dequantising)."""
    models = real_models_dir()
    home = tmp_path / "tinkrl_home"
    home.mkdir()
    (home / "models").symlink_to(models, target_is_directory=True)
    monkeypatch.setenv("TINKRL_HOME", str(home))
    return home


@pytest.fixture
def fake_cpu(monkeypatch):
    """`fake_cpu(flags, vendor_id="GenuineIntel", kernels=True)` makes the plan's one probe see another
    CPU: /proc/cpuinfo's flags and vendor as given, the kernels built for this machine limited to what
    those flags allow (none with `kernels=False`), oneDNN's bf16 products as those flags allow. Returns
    the probe's `Machine`; engines made meanwhile are the test's own."""
    from tinkrl.local import plan, transformer
    from tinkrl.local.engine import Engine
    from tinkrl.local.kernels import library

    monkeypatch.setattr(Engine, "_engines", {})

    def fake(flags: str, vendor_id: str = "GenuineIntel", kernels: bool = True):
        monkeypatch.setattr(plan, "cpuinfo", lambda: {"vendor_id": vendor_id, "flags": flags})
        if not kernels:
            monkeypatch.setattr(library, "load", lambda isa=(): (None, "no C compiler (cc) on PATH"))
        plan.cpu.cache_clear()
        plan.probe.cache_clear()
        monkeypatch.setattr(transformer, "_ONEDNN_BF16", transformer._ONEDNN and plan.onednn_bf16(plan.cpu()[1]))
        return plan.probe()

    yield fake
    plan.cpu.cache_clear()  # the real CPU again once monkeypatch restores /proc/cpuinfo's reader
    plan.probe.cache_clear()


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


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> dict[str, Path]:
    """A real 3-step `tinkrl train` run of the tiny model on arithmetic (episodes exported to Docent
    files every 2 steps) and a `tinkrl eval` output on a shipped task dir: what the viewer and the
    trace exports read."""
    import os
    import subprocess
    import sys

    from helpers.engine import TINY

    root = tmp_path_factory.mktemp("tiny_run")
    home = root / "home"
    home.mkdir()
    (home / "models").symlink_to(real_models_dir(), target_is_directory=True)
    env = {**os.environ, "TINKRL_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    env.pop("DOCENT_API_KEY", None)
    env["HOME"] = str(root)  # no ~/.docent/docent.env: the export writes files
    run = root / "runs" / "arith"
    cmd = [sys.executable, "-m", "tinkrl.cli", "train", "env=arithmetic", f"model_name={TINY}", "batch_size=8"]
    cmd += ["group_size=4", "max_tokens=8", "eval_problems=4", "eval_every=2", "max_steps=3", f"log_path={run}"]
    cmd += ["docent.export_every=2"]
    out = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    train_log = out.stdout + out.stderr
    evals = root / "evals"
    tasks = Path(__file__).resolve().parents[1] / "tasks"
    cmd = [sys.executable, "-m", "tinkrl.cli", "eval", "--tasks", str(tasks), "--task-id", "hello-file"]
    cmd += ["--model", TINY, "--n", "2", "--max-turns", "2", "--max-tokens", "8", "--output-path", str(evals)]
    cmd += ["--run-id", "hello"]
    out = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return {
        "root": root,
        "run": run,
        "eval": evals / "hello",
        "home": home,
        "logs": train_log + out.stdout + out.stderr,
    }
