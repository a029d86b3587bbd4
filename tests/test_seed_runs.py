"""Seed commands that really train, and the run-directory rules they rely on.

- A seed-001-style arithmetic command (tinking keys, no `backend=`) with TINKER_BASE_URL and
  TINKER_API_KEY set trains 2 steps through the official SDK against `tinkrl serve tinker`,
  and W&B in offline mode receives each step's metrics under the run's own id.
- A run directory belongs to one run: another model or environment there is refused with one
  line; the same run resumes; a finished one says so.
- Every loss `tinkrl train` accepts trains (gspo included).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.engine import TINY
from helpers.wandb_offline import read_offline_run

from tinkrl.cli import main as tinkrl
from tinkrl.config import RL_LOSSES

QUICK = ["batch_size=8", "group_size=4", "max_tokens=6", "eval_problems=0", "eval_every=0"]


@pytest.fixture(autouse=True)
def clean_env(tmp_path, monkeypatch, isolated_home):
    monkeypatch.chdir(tmp_path)
    for var in ("TINKER_API_KEY", "TINKER_BASE_URL", "WANDB_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("TINKER_TELEMETRY", "0")


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_seed_001_arithmetic_trains_on_the_tinker_service_with_wandb_offline(tmp_path, monkeypatch, capsys):
    from tinkrl.local import ServiceClient
    from tinkrl.tinker_server.app import serve_in_thread

    command = (
        f"model_name={TINY} batch_size=8 group_size=4 optim.lr=1e-4 env=MathConfig env.dataset=arithmetic "
        "env.max_tokens=5 wandb.entity=ai2-llm wandb.project=tinker wandb.run_name=debug-arithmetic "
        "num_batches=2 eval_problems=4"
    ).split()
    with serve_in_thread(ServiceClient()) as url:
        monkeypatch.setenv("TINKER_BASE_URL", url)
        monkeypatch.setenv("TINKER_API_KEY", "tml-local")
        assert tinkrl(["train", *command, "log_path=first"]) == 0
        out = capsys.readouterr().out
        assert tinkrl(["train", *command, "log_path=second"]) == 0  # same W&B name, another run
    first_line = out.splitlines()[0]
    assert first_line.startswith("plan: 2 groups (math 2x4) = 8 rollouts/step, 2 steps of tinkrl/tiny-llama")
    assert "on backend tinker (TINKER_API_KEY and TINKER_BASE_URL are set)" in first_line
    assert "tinking dialect" in first_line and "W&B tinker/debug-arithmetic (offline)" in first_line
    # the service's engine is not this process's: the run line names the backend alone
    assert any(line.startswith("run ") and " on tinker, steps 0..2, " in line for line in out.splitlines()), out

    metrics = rows(tmp_path / "first" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1]
    assert all(m["optim/lr"] == 1e-4 for m in metrics)
    config = (tmp_path / "first" / "config.yaml").read_text()
    assert "backend: tinker" in config and "dialect: tinking" in config

    ids = []
    for name in ("first", "second"):
        run_id = json.loads((tmp_path / name / "run.json").read_text())["run_id"]
        [run_file] = (tmp_path / name / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")
        run, history = read_offline_run(run_file)
        assert run == {"run_id": run_id, "project": "tinker", "entity": "ai2-llm", "name": "debug-arithmetic"}
        logged = [h for h in history if "env/all/reward/total" in h]
        assert [h["_step"] for h in logged] == [0, 1]
        if name == "first":
            for h, m in zip(logged, metrics):
                assert h["env/all/reward/total"] == pytest.approx(m["env/all/reward/total"])
                assert h["optim/loss"] == pytest.approx(m["optim/loss"])
        ids.append(run_id)
    assert ids[0] != ids[1]  # one W&B run per run, even under one name


def test_a_run_directory_belongs_to_one_run(tmp_path, capsys):
    run = ["env=arithmetic", f"model_name={TINY}", *QUICK, "log_path=shared"]
    assert tinkrl(["train", *run, "max_steps=1"]) == 0
    record = json.loads((tmp_path / "shared" / "run.json").read_text())
    capsys.readouterr()

    # another model, another environment: refused before any work, one line naming the directory
    for change in ("model_name=tinkrl/tiny-qwen3", "env.max_value=50"):
        assert tinkrl(["train", *run, change, "max_steps=2"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("tinkrl train: error: shared holds another run (") and "\n" not in err
        assert err.endswith("start a new run with log_path=NEW_DIR")  # the run named its directory
    assert [m["step"] for m in rows(tmp_path / "shared" / "metrics.jsonl")] == [0]  # nothing lost or added

    # the same run resumes (as its plan says), under the same run id
    assert tinkrl(["train", *run, "max_steps=2", "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["start"] == "resumes its own checkpoint at step 1"
    assert tinkrl(["train", *run, "max_steps=2"]) == 0
    assert [m["step"] for m in rows(tmp_path / "shared" / "metrics.jsonl")] == [0, 1]
    assert json.loads((tmp_path / "shared" / "run.json").read_text()) == record
    capsys.readouterr()
    # a finished run says so (before loading anything) instead of silently doing nothing
    assert tinkrl(["train", *run, "max_steps=2"]) == 0
    assert "shared: finished: 2 of max_steps=2 steps trained, nothing to do" in capsys.readouterr().out


def test_a_run_that_stopped_before_its_first_step_does_not_hold_its_directory(tmp_path, capsys):
    run = ["env=arithmetic", *QUICK, "max_steps=1", "log_path=retry"]
    assert tinkrl(["train", *run, "model_name=tinkrl/tiny-lama"]) == 1  # a typo: no such model
    assert "tiny-lama" in capsys.readouterr().err
    assert tinkrl(["train", *run, f"model_name={TINY}"]) == 0  # the corrected run takes the directory
    assert json.loads((tmp_path / "retry" / "run.json").read_text())["identity"]["model_name"] == TINY


def test_runs_without_a_name_never_share_a_directory(tmp_path):
    assert tinkrl(["train", "env=arithmetic", f"model_name={TINY}", *QUICK, "max_steps=1"]) == 0
    assert tinkrl(["train", "env=arithmetic", f"model_name={TINY}", *QUICK, "max_steps=1"]) == 0
    dirs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert len(dirs) == 2 and all(d.startswith("arithmetic-") for d in dirs), dirs
    assert all(len(rows(tmp_path / "runs" / d / "metrics.jsonl")) == 1 for d in dirs)


@pytest.mark.parametrize("loss_fn", RL_LOSSES)
def test_every_accepted_loss_trains(tmp_path, loss_fn):
    extra = ["loss_fn_config.beta=0.05"] if loss_fn == "dro" else []
    # the tiny random model never answers; the format penalty with `direct` advantages gives a real signal
    argv = ["env=arithmetic", f"model_name={TINY}", *QUICK, "max_steps=1", "adv_estimator=direct"]
    argv += ["env.format_coef=0.5", f"loss_fn={loss_fn}", *extra, f"log_path={loss_fn}"]
    assert tinkrl(["train", *argv]) == 0
    [m] = rows(tmp_path / loss_fn / "metrics.jsonl")
    assert m["optim/action_tokens"] > 0 and m["optim/loss"] != 0.0 and m["optim/grad_norm"] > 0


def _adam_steps(state_path: str) -> set[int]:
    import torch

    from tinkrl.local.checkpoints import resolve_path

    state = torch.load(resolve_path(state_path) / "optimizer.pt", weights_only=False)
    return {int(s["step"]) for s in state["state"].values()}


def test_resume_from_starts_a_new_run_with_the_checkpoints_optimizer_state(tmp_path, capsys):
    base = ["env=arithmetic", f"model_name={TINY}", *QUICK, "save_every=1"]
    assert tinkrl(["train", *base, "max_steps=2", "log_path=a"]) == 0
    state = rows(tmp_path / "a" / "checkpoints.jsonl")[-1]["state_path"]
    assert _adam_steps(state) == {2}
    capsys.readouterr()
    assert tinkrl(["train", *base, "max_steps=1", "log_path=b", f"resume_from={state}"]) == 0
    out = capsys.readouterr().out
    assert f"new run from checkpoint {state} (weights and optimizer state)" in out.splitlines()[0]
    [m] = rows(tmp_path / "b" / "metrics.jsonl")
    assert m["step"] == 0  # a new run: its own steps from 0
    # Adam's moments and step count came along: one more update on top of the checkpoint's two
    assert _adam_steps(rows(tmp_path / "b" / "checkpoints.jsonl")[-1]["state_path"]) == {3}
