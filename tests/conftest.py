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
    """`fake_cpu(flags, vendor_id="GenuineIntel", kernels=None)` makes the plan's one probe see another
    CPU, whole: the flags the libraries may use there as given, its vendor, and the kernels such a CPU
    builds (by default every kernel, the bf16 products only with AVX512-BF16, AMX tiles lent where it
    has AMX; `kernels=False` for none, as without a compiler; or an explicit set, with AMX tiles as
    Linux lends them here). oneDNN's bf16
    products are faked as those flags allow. Returns the faked `Machine`; engines made meanwhile are
    the test's own. A plan made of it is what that CPU gets, whatever this machine is; a test that
    runs an engine on it passes the kernels this machine built (`probe().kernels`, read first), so
    the engine calls only kernels that exist here."""
    from tinkrl.local import compute_plan as plan
    from tinkrl.local import transformer
    from tinkrl.local.engine import Engine

    monkeypatch.setattr(Engine, "_engines", {})
    real = plan.probe()  # the kernels library built here, which the faked machine's engines load

    def fake(flags: str, vendor_id: str = "GenuineIntel", kernels: bool | frozenset[str] | None = None):
        usable = frozenset(flags.split())
        bf16 = "avx512_bf16" in usable
        if kernels is None:
            kernels = frozenset(n for n in plan._KERNELS if bf16 or n not in plan._BF16_KERNELS)
        built = frozenset(kernels or ())
        why = "" if built else "no C compiler (cc) on PATH"
        amx = "amx_bf16" in usable and bool(built) and (kernels is None or real.amx_lent)
        machine = plan.Machine(plan.vendor_of(vendor_id), usable, built, why, amx, real.isa, real.memory)
        monkeypatch.setattr(plan, "_machine", machine)
        monkeypatch.setattr(transformer, "_ONEDNN_BF16", transformer._ONEDNN and plan.onednn_bf16(usable))
        return machine

    return fake


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
