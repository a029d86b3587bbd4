"""A verifiers environment (tests/helpers/vf_arith.py: a taskset with a rubric of known functions)
trained 2 steps through the real entry point on the tiny model: every rollout goes through
verifiers' episode machinery and interception, samples through the run's OpenAI server, and its
captured tokens train; the rubric's weighted total is the reward."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tinkrl.envs.verifiers.config import VerifiersEnvConfig
from tinkrl.envs.verifiers.env import verifiers_env
from tinkrl.errors import ConfigError

needs_verifiers = pytest.mark.skipif(
    importlib.util.find_spec("verifiers") is None, reason="the verifiers extra is not installed"
)

BASE = {
    "model_name": "tinkrl/tiny-llama",
    "max_steps": 2,
    "max_tokens": 12,
    "lora_rank": 4,
    "learning_rate": 1e-3,
    "eval_every": 0,
    "save_every": 1,
    "seed": 3,
    "batch_size": 4,
    "group_size": 2,
}


def train(tmp_path: Path, environments: dict) -> tuple[dict, list[dict], Path]:
    from tinkrl.commands.plan import make_plan
    from tinkrl.commands.train import load, run

    cfg_path = tmp_path / "config.yaml"
    run_dir = tmp_path / "run"
    cfg_path.write_text(yaml.safe_dump({**BASE, "log_path": str(run_dir), "environments": environments}))
    metrics = run(make_plan(load(str(cfg_path), [])))
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return metrics, lines, run_dir


def expected_reward(reply: str) -> float:
    """tests/helpers/vf_arith.py's rubric: reply_length (weight 1) + constant 1.0 (weight 0.5)."""
    return min(len(reply), 200) / 200 + 0.5


@needs_verifiers
def test_two_steps_on_a_verifiers_env_with_a_failing_rollout(tmp_path: Path):
    env = {
        "type": "verifiers",
        "env": {
            "taskset": "helpers.vf_arith",
            "taskset_args": {"explode_idx": 1},  # step 0's second task: its rubric raises
            "shuffle": False,
            "eval_tasks": 2,
        },
    }
    metrics, lines, run_dir = train(tmp_path, {"vf": env})
    assert [m["step"] for m in lines] == [0, 1]
    step0, step1 = lines
    assert step0["env/vf/failures"] == 2 and step0["env/vf/total_episodes"] == 2  # the exploding group
    assert step1["env/vf/failures"] == 0 and step1["env/vf/total_episodes"] == 4
    for m in lines:
        assert m["env/vf/rubric/constant"] == 1.0
        total = m["env/vf/rubric/reply_length"] + 0.5 * m["env/vf/rubric/constant"]
        assert m["env/vf/reward/total"] == pytest.approx(total)
        assert m["env/vf/proxy/calls"] == 1.0 and m["env/vf/proxy/merge_rate"] == 1.0
        assert m["env/vf/proxy/datums"] == 1.0 and "env/vf/metric/correct" in m
    # each episode's reward is the rubric of its own reply (the model's sampled text)
    rows = [json.loads(x) for f in sorted((run_dir / "episodes").glob("*.jsonl")) for x in f.read_text().splitlines()]
    scored = [r for r in rows if r.get("reward") is not None]
    failed = [r for r in rows if r.get("failure_mode")]
    assert len(scored) == 6 and len(failed) == 2
    for r in scored:
        assert r["reward"] == pytest.approx(expected_reward(r["verifiers/reply"]))
        assert r["ac_tokens"] > 0
    assert any(r["trained"] for r in scored)  # a group with mixed rewards trained
    assert all(r["failure_mode"] == "agent_error" and "rubric exploded" in r["failure_detail"] for r in failed)
    assert len({r["reward"] for r in scored}) > 1  # rewards differ within groups: advantages, gradients
    # the captured tokens trained: every kept episode's sampled tokens, a gradient, checkpoints of both steps
    for m, n in zip(lines, (2, 4)):
        assert m["optim/action_tokens"] == n * m["env/vf/ac_tokens_per_turn"] and m["optim/grad_norm"] > 0
    ckpts = [json.loads(x) for x in (run_dir / "checkpoints.jsonl").read_text().splitlines()]
    assert [c["batch"] for c in ckpts] == [1, 2] and ckpts[-1]["final"]
    # held-out eval on the last two tasks at the end
    assert 0.5 <= metrics["eval/vf/greedy_reward"] <= 1.5


@needs_verifiers
def test_unknown_taskset_is_one_clear_line():
    with pytest.raises(ConfigError) as e:
        verifiers_env(VerifiersEnvConfig(taskset="no_such_vf_taskset"))
    assert "no_such_vf_taskset" in str(e.value) and "\n" not in str(e.value)


def test_unknown_config_key_is_one_clear_line(tmp_path: Path):
    from tinkrl.commands.train import load

    cfg_path = tmp_path / "config.yaml"
    envs = {"vf": {"type": "verifiers", "env": {"taskset": "helpers.vf_arith", "tasks": 3}}}
    cfg_path.write_text(yaml.safe_dump({**BASE, "log_path": str(tmp_path / "run"), "environments": envs}))
    with pytest.raises(ConfigError, match="unknown key 'tasks'"):
        from tinkrl.envs import resolve_config

        resolve_config(load(str(cfg_path), []))


def test_verifiers_missing_says_how_to_install():
    """With verifiers not importable, building the environment is one line naming the extra."""
    code = (
        "import sys; sys.modules['verifiers'] = None\n"  # as if not installed
        "from tinkrl.envs.verifiers.config import VerifiersEnvConfig\n"
        "from tinkrl.envs.verifiers.env import verifiers_env\n"
        "from tinkrl.errors import ConfigError\n"
        "try:\n"
        "    verifiers_env(VerifiersEnvConfig(taskset='gsm8k-v1'))\n"
        "except ConfigError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("pip install 'tinkrl[verifiers]'") and out.stdout.count("\n") == 1


@needs_verifiers
def test_two_steps_on_a_multi_turn_verifiers_env(tmp_path: Path):
    """An env of the test's own (tests/helpers/vf_followup.py) that asks a follow-up: two model calls
    per rollout, the second extending the first, captured into one datum."""
    env = {
        "type": "verifiers",
        "env": {"taskset": "helpers.vf_arith", "env_id": "helpers.vf_followup", "max_tasks": 3},
    }
    _, lines, run_dir = train(tmp_path, {"chat": env})
    assert [m["step"] for m in lines] == [0, 1]
    for m in lines:
        assert m["env/chat/failures"] == 0 and m["env/chat/total_episodes"] == 4
        assert m["env/chat/proxy/calls"] == 2.0 and m["env/chat/turns_per_episode"] == 2.0
        assert m["env/chat/proxy/merge_rate"] == 1.0 and m["env/chat/proxy/datums"] == 1.0
        assert m["optim/grad_norm"] > 0
    rows = [json.loads(x) for f in sorted((run_dir / "episodes").glob("*.jsonl")) for x in f.read_text().splitlines()]
    assert len(rows) == 8
    for r in rows:
        assert r["reward"] == pytest.approx(expected_reward(r["verifiers/reply"]))  # the last reply's rubric
        assert "Now double it." in r["transcript"][-2]["content"]


@needs_verifiers
def test_an_env_with_two_agent_seats_is_refused():
    with pytest.raises(ConfigError, match="has agents assistant, user; tinkrl trains") as e:
        verifiers_env(VerifiersEnvConfig(taskset="helpers.vf_arith", env_id="user-sim"))
    assert "\n" not in str(e.value)


@needs_verifiers
def test_an_infinite_taskset_needs_max_tasks_and_is_bounded_by_it():
    """verifiers 0.3.1 marks an endless taskset `INFINITE`; max_tasks + eval_tasks of it are taken."""
    import itertools
    from types import SimpleNamespace

    from helpers.vf_arith import ArithTaskset, ArithTasksetConfig

    from tinkrl.envs.verifiers.env import load_tasks

    class Endless(ArithTaskset):
        INFINITE = True

        def load(self):
            return itertools.chain.from_iterable(ArithTaskset.load(self) for _ in itertools.count())

    env = SimpleNamespace(taskset=Endless(ArithTasksetConfig()))
    with pytest.raises(ConfigError, match="is infinite: set env.max_tasks"):
        load_tasks(env, VerifiersEnvConfig(taskset="endless"))
    train, held_out = load_tasks(env, VerifiersEnvConfig(taskset="endless", max_tasks=8, eval_tasks=2))
    assert len(train) == 8 and len(held_out) == 2
