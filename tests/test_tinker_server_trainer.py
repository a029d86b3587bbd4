"""The trainer with backend=tinker against `tinkrl serve tinker` matches backend=local.

Same seeded run both ways: the only difference is that every call of the second one goes
through the official SDK and HTTP. Rollouts run one at a time so the engine's sampler
draws its random numbers in the same order in both runs; then every metric that does not
measure time must agree, the losses to 1e-4. A run's end, finished or failed, is the end
of its session on the service.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from helpers.tinker_sessions import finish_reasons

from tinkrl.local import ServiceClient as LocalServiceClient
from tinkrl.local.models import TINY_MODEL
from tinkrl.tinker_server.app import TinkerServer, serve_in_thread

os.environ.setdefault("TINKER_TELEMETRY", "0")

RUN = {
    "model_name": TINY_MODEL,
    "env": "arithmetic",
    "max_steps": 2,
    "batch_size": 4,
    "group_size": 2,
    "max_tokens": 6,
    "lora_rank": 4,
    "learning_rate": 5e-3,
    "temperature": 1.0,
    "seed": 3,
    "eval_every": 0,
    "eval_problems": 0,
    "save_every": 0,
    "max_concurrent_rollouts": 1,
    # The tiny random model never answers, so the format penalty is its whole reward; with
    # `direct` advantages (A = reward) that still gives a non-zero loss and real updates.
    "env.format_coef": 0.5,
    "adv_estimator": "direct",
}


def _train(tmp_path: Path, name: str, **extra) -> list[dict]:
    from tinkrl.commands.plan import make_plan
    from tinkrl.commands.train import load, run

    overrides = [f"{k}={v}" for k, v in {**RUN, **extra, "log_path": str(tmp_path / name)}.items()]
    run(make_plan(load(None, overrides)))
    return [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


def test_backend_tinker_through_the_server_matches_backend_local(tmp_path, monkeypatch):
    engine = LocalServiceClient()
    # Load the model before either run: loading re-seeds torch, and it must not happen
    # inside one run only.
    engine.create_sampling_client(base_model=TINY_MODEL)
    local = _train(tmp_path, "local", backend="local")
    server = TinkerServer(engine)
    with serve_in_thread(server=server) as url:
        monkeypatch.setenv("TINKER_API_KEY", "tml-local")
        remote = _train(tmp_path, "tinker", backend="tinker", base_url=url)
    assert finish_reasons(server) == ["success"]  # the run's one session, finished when the run was

    assert len(local) == len(remote) == 2
    assert remote[0]["optim/loss"] == pytest.approx(local[0]["optim/loss"], abs=1e-4)
    assert abs(local[0]["optim/loss"]) > 1.0  # a real loss, not 0 == 0
    assert local[1]["optim/entropy"] != pytest.approx(local[0]["optim/entropy"], abs=1e-4)  # it trained
    for step_local, step_remote in zip(local, remote):
        for key, value in step_local.items():
            if key.startswith("time/") or not isinstance(value, (int, float)):
                continue
            assert step_remote[key] == pytest.approx(value, abs=1e-4), key


def test_a_run_that_fails_ends_its_session_as_errored(tmp_path, monkeypatch):
    """The error goes on to the caller; the service has recorded the run's session as errored."""
    from tinkrl.commands.plan import make_plan
    from tinkrl.commands.train import load
    from tinkrl.rl.train import main

    def no_environments(renderer, run_dir):
        raise RuntimeError("no environments today")

    server = TinkerServer(LocalServiceClient())
    with serve_in_thread(server=server) as url:
        monkeypatch.setenv("TINKER_API_KEY", "tml-local")
        overrides = [f"{k}={v}" for k, v in {**RUN, "backend": "tinker", "base_url": url}.items()]
        config = load(None, [*overrides, f"log_path={tmp_path / 'failed'}"])
        with pytest.raises(RuntimeError, match="no environments today"):
            asyncio.run(main(make_plan(config), no_environments))
    assert finish_reasons(server) == ["errored"]
