"""Training through the real entry point on a remote ORS environment (tests/helpers/ors_toy_env.py).

The tiny random model never manages a tool call, so every ORS episode runs to the turn
limit and scores the non-terminal reward: exact values the tests can assert.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from helpers.ors import start_toy_server, stop

from tinkrl.envs.ors.client import open_session_count

BASE = {
    "model_name": "tinkrl/tiny-llama",
    "max_steps": 2,
    "max_tokens": 12,
    "lora_rank": 4,
    "learning_rate": 1e-3,
    "eval_every": 0,
    "eval_problems": 2,
    "save_every": 0,
    "seed": 3,
}


def adder_entry(url: str, **extra) -> dict:
    return {
        "base_url": url,
        "num_rollouts": 2,
        "reward_reduction": "sum",
        "nonterminal_reward": -0.5,
        "splits": {"train": {"shuffle": True, "num_samples": 4}},
        "env": {"max_turns": 2},
        **extra,
    }


def train(tmp_path: Path, environments: dict, batch_size: int) -> tuple[dict, list[dict]]:
    from tinkrl.commands.plan import make_plan
    from tinkrl.commands.train import load, run

    cfg_path = tmp_path / "config.yaml"
    cfg_path.write_text(
        yaml.safe_dump(
            {
                **BASE,
                "batch_size": batch_size,
                "group_size": 2,
                "log_path": str(tmp_path / "run"),
                "environments": environments,
            }
        )
    )
    metrics = run(make_plan(load(str(cfg_path), [])))
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    return metrics, lines


@pytest.fixture(scope="module")
def toy_server():
    proc, url = start_toy_server()
    yield url
    stop(proc)


@pytest.mark.slow  # ~1 min; the mixed run below trains the same remote env in the default suite
def test_two_steps_on_a_remote_ors_env(toy_server, tmp_path: Path):
    entry = adder_entry(toy_server)
    entry["splits"]["test"] = {"num_samples": 2}
    metrics, lines = train(tmp_path, {"adder": entry}, batch_size=4)
    assert len(lines) == 2
    for m in lines:
        assert m["env/adder/total_episodes"] == 4 and m["env/adder/failures"] == 0
        assert m["env/adder/reward/total"] == pytest.approx(-0.5)  # never finished: nonterminal_reward
        assert m["env/adder/turns"] == 2 and m["env/adder/finished"] == 0
        assert m["groups/kept"] == 2
    assert metrics["eval/adder/greedy_reward"] == pytest.approx(-0.5)  # the test split, at the end
    assert list((tmp_path / "run" / "rollouts").iterdir())
    assert open_session_count() == 0


def test_remote_env_mixed_with_arithmetic(toy_server, tmp_path: Path):
    envs = {
        "adder": adder_entry(toy_server, temperature=0.7),
        "arithmetic": {"num_rollouts": 2, "env": {"max_value": 20}},
    }
    _, lines = train(tmp_path, envs, batch_size=8)
    assert len(lines) == 2
    for m in lines:
        assert m["env/adder/total_episodes"] == 4 and m["env/arithmetic/total_episodes"] == 4
        assert m["env/adder/reward/total"] == pytest.approx(-0.5)
        assert "env/arithmetic/correct" in m and m["env/all/total_episodes"] == 8
    assert open_session_count() == 0


def test_env_server_killed_mid_run_is_recorded_and_the_run_goes_on(tmp_path: Path):
    proc, url = start_toy_server(die_at_session=3)  # dies while step 0's sessions are being opened
    try:
        envs = {
            "adder": adder_entry(url, env={"max_turns": 2, "session_retries": 0, "call_timeout_s": 5}),
            "arithmetic": {"num_rollouts": 2, "env": {"max_value": 20}},
        }
        _, lines = train(tmp_path, envs, batch_size=8)
        assert proc.wait(timeout=5) != 0  # the server really died
    finally:
        stop(proc)
    assert len(lines) == 2  # both steps ran
    assert lines[0]["env/adder/failures"] >= 1
    assert lines[1]["env/adder/failures"] == 4 and lines[1]["env/adder/total_episodes"] == 0
    assert all(m["groups/dropped_failing"] >= 1 for m in lines)
    assert all(m["env/arithmetic/total_episodes"] == 4 for m in lines)  # the other env kept training
    assert open_session_count() == 0
