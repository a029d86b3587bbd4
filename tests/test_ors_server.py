"""`tinkrl serve env arithmetic` driven by the openreward SDK's own client, and by tinkrl's ORS env."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from helpers.ors import free_port, start_server, stop

from tinkrl.errors import ConfigError


@pytest.fixture(scope="module")
def arithmetic_server():
    port = free_port()
    proc, url = start_server(
        [
            "-m",
            "tinkrl.cli",
            "serve",
            "env",
            "--port",
            str(port),
            "--train-size",
            "20",
            "--eval-problems",
            "5",
            "arithmetic",
            "arithmetic.max_value=20",
        ],
        port,
    )
    yield url
    stop(proc)


def _sum(question: str) -> int:
    a, b = map(int, re.search(r"What is (\d+) \+ (\d+)\?", question).groups())
    return a + b


def test_sdk_client_lists_splits_tasks_tools_and_gets_rewards(arithmetic_server):
    from openreward import OpenReward

    with OpenReward(api_key="") as client:
        env = client.environments.get("arithmetic", base_url=arithmetic_server)
        assert env.list_splits() == ["train", "test"]
        train = env.list_tasks("train")
        assert len(train) == 20 and len(env.list_tasks("test")) == 5
        spec = train[3].task_spec
        assert set(spec) == {"id", "question"}  # the reference answer stays on the server
        assert all(10 <= int(x) <= 20 for x in re.findall(r"\d+", spec["question"]))
        tools = env.list_tools()
        assert [t.name for t in tools] == ["answer"]
        assert tools[0].input_schema["required"] == ["answer"]

        with env.session(split="train", index=3) as session:
            prompt = session.get_prompt()
            assert spec["question"] in prompt[0].text and "answer" in prompt[0].text
            out = session.call_tool("answer", {"answer": f"The sum is {_sum(spec['question'])}."})
            assert out.reward == 1.0 and out.finished
        with env.session(split="train", index=3) as session:
            out = session.call_tool("answer", {"answer": str(_sum(spec["question"]) + 1)})
            assert out.reward == 0.0 and out.finished
        with env.session(split="test", index=0) as session:
            from openreward.api.errors import ToolCallError

            with pytest.raises(ToolCallError) as err:
                session.call_tool("answer", {"wrong": "1"})
            assert err.value.reason == "input_validation"


def test_tinkrl_env_trains_against_tinkrl_server(arithmetic_server, tmp_path):
    """The ORS env (client side) drives the served arithmetic env: prompt, tool call, reward."""
    from tinkrl.config import EnvEntry, SplitConfig
    from tinkrl.envs import EnvContext
    from tinkrl.envs.ors.config import OpenRewardEnvConfig
    from tinkrl.envs.ors.env import build_datasets
    from tinkrl.local.models import load_tokenizer
    from tinkrl.renderers import get_renderer

    renderer = get_renderer(load_tokenizer("tinkrl/tiny-llama"), "tinkrl/tiny-llama")
    entry = EnvEntry(
        base_url=arithmetic_server,
        name="arithmetic",
        splits={"train": SplitConfig(shuffle=False), "test": SplitConfig()},
    )
    ctx = EnvContext(
        key="remote-arith",
        entry=entry,
        renderer=renderer,
        model_name="tinkrl/tiny-llama",
        group_size=2,
        groups_per_batch=2,
        max_tokens=16,
        run_dir=tmp_path,
        seed=0,
    )
    ds = build_datasets(OpenRewardEnvConfig(), ctx)
    assert ds.test is not None and len(ds.train) == 10

    async def episode():
        env = (await ds.train.get_batch(0)[0].make_envs())[0]
        ob, _ = await env.initial_observation()
        text = renderer.tokenizer.decode(ob.to_ints())
        question = re.search(r"What is \d+ \+ \d+\?", text).group(0)
        call = {"name": "answer", "arguments": {"answer": str(_sum(question))}}
        act = renderer.tokenizer.encode(f"<tool_call>\n{json.dumps(call)}\n</tool_call>", add_special_tokens=False) + [
            renderer.im_end
        ]
        res = await env.step(act)
        await env.close()
        return res

    res = asyncio.run(episode())
    assert res.episode_done and res.reward == 1.0 and res.metrics["finished"] == 1.0


def test_unknown_or_unsupported_env_is_a_config_error():
    from tinkrl.commands.serve_env import cli_main, parse_env_args
    from tinkrl.env_server.app import environment_classes

    with pytest.raises(ConfigError, match="unknown environment"):
        environment_classes(parse_env_args(["nosuchenv"]))
    with pytest.raises(ConfigError, match="not supported"):
        environment_classes(parse_env_args(["erdos"]))
    assert cli_main(["arithmetic.max_value"]) == 2


def test_serve_tasks_runs_tools_in_a_sandbox_and_grades_on_submit():
    """`tinkrl serve env tasks`: the agent tools over ORS, the task's tests give the reward."""
    from openreward import OpenReward

    port = free_port()
    proc, url = start_server(
        [
            "-m",
            "tinkrl.cli",
            "serve",
            "env",
            "--port",
            str(port),
            "tasks",
            "tasks.path=tasks/hello-file",
            "tasks.gate=false",
        ],
        port,
    )
    try:
        with OpenReward(api_key="") as client:
            # variant= names the environment's path: "/tasks" alone is the task-list route
            env = client.environments.get("tasks", variant="tasks", base_url=url)
            assert env.list_splits() == ["train"]
            assert [t.task_spec for t in env.list_tasks("train")] == [{"id": "hello-file"}]
            tools = {t.name: t for t in env.list_tools()}
            assert {"execute_bash", "file_editor", "submit"} <= set(tools)
            assert "command" in tools["execute_bash"].input_schema["properties"]
            with env.session(split="train", index=0) as session:
                assert "hello.txt" in session.get_prompt()[0].text
                out = session.call_tool(
                    "execute_bash", {"command": "echo 'Hello, world!' > /app/hello.txt && cat /app/hello.txt"}
                )
                assert "Hello, world!" in out.blocks[0].text and not out.finished and out.reward is None
                out = session.call_tool("execute_bash", {"nonsense": 1})  # a bad call is an observation
                assert "rror" in out.blocks[0].text and not out.finished
                out = session.call_tool("submit", {})
                assert out.finished and out.reward == 1.0
            with env.session(split="train", index=0) as session:  # a fresh sandbox: nothing done -> 0
                out = session.call_tool("submit", {})
                assert out.finished and out.reward == 0.0
    finally:
        stop(proc)
