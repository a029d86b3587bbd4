"""`env: external_agent` end to end: a 2-step `tinkrl train` on the tiny model where every rollout of
one environment is an unmodified mini-swe-agent `mini` process, another is a plain script plugged
in by a command template (it acts on its sandbox through the sandbox URL and is graded 1), and a
third is an agent command that crashes (recorded as agent_error; the run goes on). Also: mini's
environment class runs commands in the rollout's bwrap sandbox, not on the host."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.engine import TINY, real_models_dir
from helpers.requirements import needs_bwrap

from tinkrl.errors import ConfigError

pytest.importorskip("minisweagent.run.mini", reason="mini-swe-agent is not installed (pip install 'tinkrl[agents]')")

TASKS = Path(__file__).resolve().parents[1] / "tasks"

# A user's own agent, plugged in by a command template: it asks the model once (through the
# rollout's base URL, so the call is captured), then solves hello-file through the sandbox URL.
SCRIPTED_AGENT = """
import json, os, sys, urllib.request, openai
client = openai.OpenAI()  # OPENAI_BASE_URL / OPENAI_API_KEY from the environment
client.chat.completions.create(model=os.environ["OPENAI_MODEL"], max_tokens=int(os.environ["TINKRL_MAX_TOKENS"]),
    messages=[{"role": "user", "content": os.environ["TINKRL_INSTRUCTION"]}])
body = json.dumps({"command": "printf 'Hello, world!\\\\n' > hello.txt && hostname", "workdir": sys.argv[1]})
req = urllib.request.Request(os.environ["TINKRL_SANDBOX_URL"] + "/exec", body.encode(),
    {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
print(json.loads(urllib.request.urlopen(req).read()))
"""


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@needs_bwrap
def test_two_step_train_of_unmodified_agents(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(real_models_dir(), target_is_directory=True)
    hello = str(TASKS / "hello-file")
    common = {"path": hello, "gate": False, "timeout_s": 400}
    config = {
        "model_name": TINY,
        "backend": "local",
        "environments": {
            "mini": {"type": "external_agent", "env": {**common, "step_limit": 2}},
            "scripted": {
                "type": "external_agent",
                "env": {**common, "agent": "command", "command": [sys.executable, "-c", SCRIPTED_AGENT, "{workdir}"]},
            },
            "broken": {
                "type": "external_agent",
                "env": {**common, "agent": "command", "command": [sys.executable, "-c", "raise SystemExit(3)"]},
            },
        },
        "batch_size": 6,
        "group_size": 2,
        "max_tokens": 16,
        "max_steps": 2,
        "eval_every": 0,
        "eval_problems": 0,
        "save_every": 0,
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    run = tmp_path / "run"
    env = {**os.environ, "TINKRL_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "tinkrl.cli", "train", "run.yaml", f"log_path={run}"]
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stdout + out.stderr

    metrics = rows(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1]  # the crashing agent did not stop the run
    for m in metrics:
        assert m["env/broken/failures"] == 2 and m["env/broken/total_episodes"] == 0
        assert m["env/scripted/reward/total"] == 1.0  # graded by the task's own tests
        assert m["env/scripted/proxy/calls"] == 1.0
        assert m["env/mini/total_episodes"] == 2, m
        assert 0.0 <= m["env/mini/proxy/merge_rate"] <= 1.0 and m["env/mini/proxy/calls"] >= 1
        assert "env/mini/reward/total" in m
        assert m["optim/action_tokens"] > 0 and "optim/entropy" in m  # the captured tokens were trained on

    episodes = [e for step in range(2) for e in rows(run / "episodes" / f"step_{step:06d}.jsonl")]
    broken = [e for e in episodes if e["env"] == "broken"]
    assert len(broken) == 4 and all(e["failure_mode"] == "agent_error" for e in broken)
    assert all("exited 3" in e["failure_detail"] for e in broken)
    mini = [e for e in episodes if e["env"] == "mini"]
    assert len(mini) == 4 and all(e.get("failure_mode") is None for e in mini)
    for episode in mini:
        folder = run / episode["agent/log_dir"]
        assert folder.parent.name == f"step_{episode['step']}"
        assert "This is mini-swe-agent version 2.4.6" in (folder / "agent.log").read_text()
        trajectory = json.loads((folder / "trajectory.json").read_text())  # mini's own record of the run
        info = trajectory["info"]
        assert info["config"]["environment_type"] == "tinkrl.harness.mini_swe_agent.TinkrlSandboxEnvironment"
        # every model call mini made is a captured turn of the episode
        assert info["model_stats"]["api_calls"] == episode["turns"] >= 1
    logs = sorted((run / "agents").glob("step_*/*/agent.log"))
    assert len(logs) == 12  # every rollout of every environment keeps its agent's log


@needs_bwrap
def test_mini_environment_class_runs_in_the_rollout_sandbox(tmp_path):
    from minisweagent.exceptions import Submitted

    from tinkrl.envs.external_agent.run_server import RunServer
    from tinkrl.harness.mini_swe_agent import TinkrlSandboxEnvironment
    from tinkrl.local import ServiceClient
    from tinkrl.sandbox import get_provider
    from tinkrl.taskdirs import load_task
    from tinkrl.taskdirs.verifier import grade, start_sandbox

    task = load_task(TASKS / "hello-file")
    server = RunServer(TINY)
    runner = server.runner(ServiceClient().create_sampling_client(base_model=TINY))
    sandbox = start_sandbox(task, get_provider("bwrap"))
    try:
        session = runner.session(sandbox=sandbox, workdir=task.workdir)
        env = TinkrlSandboxEnvironment(url=session.sandbox_url, api_key=session.api_key, cwd=task.workdir, timeout=5)
        with pytest.raises(RuntimeError, match="404"):  # not registered: the rollout is not running
            env.execute({"command": "true"})
        runner.server.sandboxes[session.rollout_id] = sandbox
        marker = tmp_path / "host-marker"
        out = env.execute({"command": f"printf 'Hello, world!\\n' > hello.txt; pwd; touch {marker}; ls /app"})
        assert out["returncode"] in (0, 1) and "/app" in out["output"] and "hello.txt" in out["output"]
        assert not marker.exists()  # the command ran in the sandbox, not on the host
        assert grade(task, sandbox).reward == 1.0
        slow = env.execute({"command": "sleep 30"}, timeout=1)
        assert "timed out" in slow["exception_info"]
        with pytest.raises(Submitted):
            env.execute({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})
        bad_key = TinkrlSandboxEnvironment(url=session.sandbox_url, api_key="wrong")
        with pytest.raises(RuntimeError, match="401"):
            bad_key.execute({"command": "true"})
    finally:
        sandbox.close()
        server.close()


def test_missing_mini_swe_agent_is_one_clear_line(monkeypatch):
    from tinkrl.envs.external_agent import env as agent_env

    real = agent_env.importlib.util.find_spec
    monkeypatch.setattr(
        agent_env.importlib.util, "find_spec", lambda name, *a: None if name == "minisweagent" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"pip install 'tinkrl\[agents\]'"):
        agent_env.mini_executable()


def test_config_errors():
    from tinkrl.config import EnvEntry
    from tinkrl.envs import make_env_config

    with pytest.raises(ConfigError, match="agent: command needs `command`"):
        make_env_config("x", EnvEntry(type="external_agent", env={"agent": "command"}))
    cfg = make_env_config("x", EnvEntry(type="external_agent", env={"task_ids": ["hello-file"]}))
    assert cfg.agent == "mini-swe-agent" and cfg.task_ids == ["hello-file"]


def test_mini_command_template_fills_per_rollout():
    from tinkrl.envs.external_agent.config import ExternalAgentEnvConfig
    from tinkrl.envs.external_agent.env import make_agent
    from tinkrl.envs.external_agent.runner import AgentSession
    from tinkrl.rl.types import SamplingSettings

    cfg = ExternalAgentEnvConfig(
        mini_mode="tools", step_limit=3, mini_overrides=["agent.max_consecutive_format_errors=9"]
    )
    agent = make_agent(cfg, SamplingSettings(max_tokens=64, temperature=0.5))
    session = AgentSession(
        "http://h/rollouts/r1/v1", "k", "m/x", "r1", "do it", sandbox_url="http://h/rollouts/r1/sandbox"
    )
    argv = [agent._substitute(a, session.values()) for a in agent.argv]
    assert "openai/m/x" in argv and "mini.yaml" in argv and "litellm" in argv and "do it" in argv
    for spec in (
        "model.model_kwargs.api_base=http://h/rollouts/r1/v1",
        "environment.url=http://h/rollouts/r1/sandbox",
        "model.model_kwargs.temperature=0.5",
        "model.model_kwargs.max_tokens=64",
        "agent.step_limit=3",
        "agent.max_consecutive_format_errors=9",
    ):
        assert spec in argv, spec
    env = agent.environment(session)
    assert env["MSWEA_CONFIGURED"] == "true"
    # the run server's key reaches mini through its environment only, never its command line or files
    assert env["OPENAI_API_KEY"] == "k" and not any("api_key" in a for a in argv)
    assert (env["TINKRL_TEMPERATURE"], env["TINKRL_MAX_TOKENS"], env["TINKRL_STEP_LIMIT"]) == ("0.5", "64", "3")
    assert asyncio.iscoroutinefunction(agent.__call__)
