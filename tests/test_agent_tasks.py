"""The agent-task Env driven by a scripted policy: hand-written action tokens through real sandboxes.

Each action is text encoded with the model's tokenizer plus <|im_end|>, as the sampler returns
it. The fixture tasks come from tasks/ (graded by their real tests).
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
from helpers.requirements import needs_bwrap

from tinkrl.envs.agent_tasks.env import build_datasets
from tinkrl.errors import ConfigError, InfraFailure
from tinkrl.taskdirs import iter_tasks, load_task

pytestmark = needs_bwrap

TASKS = Path(__file__).resolve().parents[1] / "tasks"
HELLO = "printf 'Hello, world!\\n' > /app/hello.txt"


@pytest.fixture(scope="module")
def provider(bwrap_provider):
    from tinkrl.sandbox import LazyProvider

    return LazyProvider(bwrap_provider)


def action(renderer, text: str, clean: bool = True) -> list[int]:
    tokens = renderer.tokenizer.encode(text, add_special_tokens=False)
    return tokens + [renderer.im_end] if clean else tokens


def call(name: str, args: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def make_env(renderer, provider, task="hello-file", capture_patch=False, **cfg):
    from tinkrl.agents.episode import SessionEnv
    from tinkrl.agents.session import TaskSession
    from tinkrl.envs.agent_tasks.config import TasksEnvConfig
    from tinkrl.envs.agent_tasks.env import renderer_for

    config = TasksEnvConfig(**cfg)
    task = load_task(TASKS / task) if isinstance(task, str) else task
    return SessionEnv(
        TaskSession(task, config, provider, capture_patch),
        renderer_for(renderer, config.tool_format, "tasks"),
        config.max_tokens_per_turn,
    )


def run(coro):
    return asyncio.run(coro)


def test_scripted_solution_then_submit_scores_1_and_observations_extend_the_prompt(renderer, provider):
    async def episode():
        env = make_env(renderer, provider)
        try:
            ob, stop = await env.initial_observation()
            assert stop == [renderer.im_end]
            prompt = renderer.tokenizer.decode(ob.to_ints())
            assert "Create a file called /app/hello.txt" in prompt and '"name": "execute_bash"' in prompt
            a1 = action(
                renderer, "I will create it.\n" + call("execute_bash", {"command": HELLO + "; cat /app/hello.txt"})
            )
            r1 = await env.step(a1)
            assert not r1.episode_done and r1.reward == 0.0
            nxt = r1.next_observation.to_ints()
            assert nxt[: len(ob.to_ints()) + len(a1)] == ob.to_ints() + a1  # prompt + action, token for token
            tail = renderer.tokenizer.decode(nxt[len(ob.to_ints()) + len(a1) :])
            assert "<tool_response>\nHello, world!\n[exit code: 0]\n</tool_response>" in tail
            assert tail.endswith("<|im_start|>assistant\n")
            a2 = action(renderer, call("submit", {}))
            r2 = await env.step(a2)
            return r2, env.session
        finally:
            await env.close()

    result, session = run(episode())
    assert result.episode_done and result.reward == 1.0
    m = result.metrics
    assert m["tasks/turns"] == 2 and m["tasks/tool_calls"] == 2 and m["tasks/end/submit"] == 1.0
    assert m["tasks/malformed_calls"] == 0 and m["tasks/reward"] == 1.0
    assert result.logs["tasks/end"] == "submit" and "reward.txt: 1" in result.logs["tasks/grade"]
    assert [msg["role"] for msg in session.messages] == ["system", "user", "assistant", "tool", "assistant", "tool"]


def test_malformed_tool_call_is_an_error_observation_and_the_episode_goes_on(renderer, provider):
    async def episode():
        env = make_env(renderer, provider)
        try:
            ob, _ = await env.initial_observation()
            bad = action(renderer, '<tool_call>\n{"name": "execute_bash", "arguments": {"command": "ls"\n</tool_call>')
            r1 = await env.step(bad)
            assert not r1.episode_done
            tail = renderer.tokenizer.decode(r1.next_observation.to_ints()[len(ob.to_ints()) + len(bad) :])
            assert "Error: tool call is not valid JSON" in tail
            r2 = await env.step(action(renderer, "Let me think about it."))  # no call at all
            assert not r2.episode_done
            assert "You did not call a tool" in renderer.tokenizer.decode(r2.next_observation.to_ints()[-80:])
            unknown = await env.step(action(renderer, call("rm_rf", {})))
            assert "unknown tool 'rm_rf'" in renderer.tokenizer.decode(unknown.next_observation.to_ints()[-60:])
            return await env.step(action(renderer, call("submit", {})))
        finally:
            await env.close()

    r = run(episode())
    assert r.episode_done and r.reward == 0.0  # submitted without creating the file: graded, 0
    assert r.metrics["tasks/malformed_calls"] == 1 and r.metrics["tasks/no_tool_call_turns"] == 1
    assert r.metrics["tasks/turns"] == 4 and r.metrics["tasks/end/submit"] == 1


def test_turn_limit_ends_the_episode_and_it_is_graded(renderer, provider):
    async def episode():
        env = make_env(renderer, provider, max_turns=2)
        try:
            await env.initial_observation()
            r1 = await env.step(action(renderer, call("execute_bash", {"command": HELLO})))
            assert not r1.episode_done
            return await env.step(action(renderer, "Done, I think."))  # never submits
        finally:
            await env.close()

    r = run(episode())
    assert r.episode_done and r.reward == 1.0 and r.logs["tasks/end"] == "max_turns"
    assert r.metrics["tasks/end/max_turns"] == 1


def test_a_command_failing_the_same_way_twice_ends_the_episode_and_it_is_graded(renderer, provider):
    """The same command with the same error a second time ends the episode, graded as the sandbox stands
    (here the file was written first, so it scores 1); a different failure in between does not end it,
    and with end_on_repeated_failure off the turns run out instead."""
    failing = call("execute_bash", {"command": "cat /app/missing.txt"})

    async def episode(**cfg):
        env = make_env(renderer, provider, max_turns=6, **cfg)
        try:
            await env.initial_observation()
            for command in (HELLO, "cat /app/missing.txt", "ls /app/nowhere"):
                r = await env.step(action(renderer, call("execute_bash", {"command": command})))
                assert not r.episode_done
            return await env.step(action(renderer, failing))
        finally:
            await env.close()

    r = run(episode())
    assert r.episode_done and r.logs["tasks/end"] == "repeated_failure" and r.reward == 1.0
    assert r.metrics["tasks/end/repeated_failure"] == 1 and r.metrics["tasks/turns"] == 4
    r = run(episode(end_on_repeated_failure=False))
    assert not r.episode_done


def test_command_timeout_is_an_observation_and_a_cut_action_is_closed(renderer, provider):
    async def episode():
        env = make_env(renderer, provider, command_timeout_s=1)
        try:
            ob, _ = await env.initial_observation()
            a1 = action(renderer, call("execute_bash", {"command": "echo started; sleep 20", "timeout": 300}))
            r1 = await env.step(a1)
            assert not r1.episode_done
            tail = renderer.tokenizer.decode(r1.next_observation.to_ints()[len(ob.to_ints()) + len(a1) :])
            assert "started" in tail and "timed out after 1s" in tail
            # An action cut by max_tokens (no <|im_end|>): the observation closes the turn first.
            prev = r1.next_observation.to_ints()
            cut = action(renderer, "I am going to write a very long expla", clean=False)
            r2 = await env.step(cut, stop_reason="length")
            nxt = r2.next_observation.to_ints()
            assert nxt[: len(prev) + len(cut)] == prev + cut and nxt[len(prev) + len(cut)] == renderer.im_end
            assert "cut off at the token limit" in renderer.tokenizer.decode(nxt[len(prev) + len(cut) :])
            r3 = await env.step(action(renderer, call("execute_bash", {"command": HELLO}) + call("submit", {})))
            return r3
        finally:
            await env.close()

    r = run(episode())
    assert r.episode_done and r.reward == 1.0
    assert r.metrics["tasks/command_timeouts"] == 1 and r.metrics["tasks/truncated_turns"] == 1
    assert r.metrics["tasks/tool_calls"] == 3


def test_time_limit_caps_commands_ends_the_episode_and_it_is_graded(renderer, provider):
    async def episode():
        env = make_env(renderer, provider, episode_timeout_s=2, command_timeout_s=60)
        try:
            await env.initial_observation()
            # the command's timeout is capped by the time the episode has left
            return await env.step(action(renderer, call("execute_bash", {"command": HELLO + "; sleep 30"})))
        finally:
            await env.close()

    r = run(episode())
    assert r.episode_done and r.logs["tasks/end"] == "time_limit" and r.reward == 1.0
    assert r.metrics["tasks/command_timeouts"] == 1 and r.metrics["tasks/end/time_limit"] == 1


def test_context_overflow_ends_the_episode_with_reward_0(renderer, provider):
    from tinkrl.agents.session import TaskSession
    from tinkrl.agents.tools import TOOL_SCHEMAS
    from tinkrl.envs.agent_tasks.config import TasksEnvConfig

    task = load_task(TASKS / "hello-file")
    first = TaskSession(task, TasksEnvConfig(), provider).first_messages()
    prompt_len = renderer.build_generation_prompt(first, TOOL_SCHEMAS).length

    async def episode():
        env = make_env(renderer, provider, max_context_tokens=prompt_len + 120)
        try:
            await env.initial_observation()
            assert env.max_tokens(1000) == 120  # the rest of the context, not the per-turn default
            # solves the task, but the long output does not fit the context
            return await env.step(action(renderer, call("execute_bash", {"command": HELLO + "; seq 1 500"})))
        finally:
            await env.close()

    r = run(episode())
    assert r.episode_done and r.reward == 0.0 and r.logs["tasks/end"] == "context_overflow"


def test_xml_tool_format(renderer, provider):
    async def episode():
        env = make_env(renderer, provider, tool_format="xml")
        try:
            ob, _ = await env.initial_observation()
            assert "<function=NAME>" in renderer.tokenizer.decode(ob.to_ints())
            text = (
                f"<function=execute_bash>\n<parameter=command>{HELLO}</parameter>\n</function>\n"
                "<function=submit>\n</function>"
            )
            return await env.step(action(renderer, text))
        finally:
            await env.close()

    r = run(episode())
    assert r.episode_done and r.reward == 1.0 and r.metrics["tasks/tool_calls"] == 2


def test_sandbox_death_and_a_broken_workspace_are_infra_failures(renderer, provider, tmp_path):
    async def dead_sandbox():
        env = make_env(renderer, provider)
        try:
            await env.initial_observation()
            env.session.sandbox.proc.kill()  # the sandbox dies under the episode
            env.session.sandbox.proc.wait()
            await env.step(action(renderer, call("execute_bash", {"command": "ls"})))
        finally:
            await env.close()

    with pytest.raises(InfraFailure) as e:
        run(dead_sandbox())
    assert e.value.failure_mode == "sandbox_died"

    task_dir = tmp_path / "broken-setup"
    (task_dir / "environment").mkdir(parents=True)
    (task_dir / "tests").mkdir()
    (task_dir / "task.toml").write_text('[task]\nname = "broken-setup"\n')
    (task_dir / "instruction.md").write_text("Do something.\n")
    (task_dir / "environment" / "setup.sh").write_text("echo cannot prepare >&2; exit 3\n")
    (task_dir / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")

    async def broken():
        env = make_env(renderer, provider, task=load_task(task_dir))
        try:
            await env.initial_observation()
        finally:
            await env.close()

    with pytest.raises(InfraFailure) as e:
        run(broken())
    assert e.value.failure_mode == "task_build_error" and "cannot prepare" in str(e.value)


def test_repo_task_records_the_workspace_diff(renderer, provider):
    task = next(t for t in iter_tasks([TASKS / "swebench_rows.jsonl"]) if t.id == "calc__calc-1")
    fix = (
        "python3 - <<'EOF'\nimport re\np = 'calc/ops.py'\ns = open(p).read()\n"
        "s = s.replace('    return a / b', '    if b == 0:\\n        raise ValueError(\"division by zero\")\\n"
        "    return a / b')\nopen(p, 'w').write(s)\nEOF"
    )

    async def episode():
        env = make_env(renderer, provider, task=task, capture_patch=True)
        try:
            await env.initial_observation()
            return await env.step(
                action(renderer, call("execute_bash", {"command": fix}) + call("submit", {}))
            ), env.session.patch
        finally:
            await env.close()

    r, patch = run(episode())
    assert r.reward == 1.0, r.logs
    assert patch.startswith("diff --git a/calc/ops.py b/calc/ops.py")
    assert '+        raise ValueError("division by zero")' in patch


def _ctx(renderer, tmp_path, **kw):
    from tinkrl.config import EnvEntry
    from tinkrl.envs import EnvContext

    args = dict(
        key="tasks",
        entry=EnvEntry(),
        renderer=renderer,
        model_name="tinkrl/tiny-llama",
        group_size=2,
        groups_per_batch=3,
        max_tokens=64,
        run_dir=tmp_path,
        seed=7,
    )
    args.update(kw)
    return EnvContext(**args)


def test_dataset_cycles_through_tasks_deterministically_in_groups(renderer, tmp_path, provider):
    from tinkrl.config import EnvEntry
    from tinkrl.envs import make_env_config

    cfg = make_env_config(
        "tasks", EnvEntry(env={"path": str(TASKS), "gate": False, "epochs": 2, "test_task_ids": ["calc__*"]})
    )
    ctx = _ctx(renderer, tmp_path, sandbox=provider)
    ds = build_datasets(cfg, ctx)
    n_train = len(cfg.load_tasks()) - 2
    assert len(ds.train) == -(-2 * n_train // 3)
    ids = [b.task.id for i in range(len(ds.train)) for b in ds.train.get_batch(i)]
    assert sorted(set(ids[:n_train])) == sorted(set(ids)) and len(set(ids[:n_train])) == n_train  # a full pass
    assert not any(i.startswith("calc__") for i in ids)
    again = build_datasets(cfg, ctx)
    assert [b.task.id for b in again.train.get_batch(1)] == ids[3:6]
    other = build_datasets(cfg, _ctx(renderer, tmp_path, seed=8, sandbox=provider))
    assert [b.task.id for i in range(3) for b in other.train.get_batch(i)] != ids[:9]
    builder = ds.train.get_batch(0)[0]
    envs = run(builder.make_envs())
    assert len(envs) == 2 and builder.logging_tags() == ["tasks"]
    assert sorted(b.task.id for b in ds.test.get_batch(0)) == ["calc__calc-1", "calc__calc-2"]


def test_config_errors_and_the_gate(renderer, tmp_path, provider, monkeypatch):
    from tinkrl.config import EnvEntry
    from tinkrl.envs import make_env_config

    with pytest.raises(ConfigError, match="unknown key 'max_turn'"):
        make_env_config("tasks", EnvEntry(env={"max_turn": 3}))
    cfg = make_env_config("tasks", EnvEntry(env={"path": str(TASKS), "task_ids": ["nope-*"]}))
    with pytest.raises(ConfigError, match="no task matches 'nope-\\*'"):
        build_datasets(cfg, _ctx(renderer, tmp_path))

    # a task whose "solution" does not solve it fails the gate and is left out of training
    monkeypatch.setenv("TINKRL_HOME", str(tmp_path / "home"))
    good = tmp_path / "tasks" / "hello-file"
    shutil.copytree(TASKS / "hello-file", good)
    bad = tmp_path / "tasks" / "hello-unsolved"
    shutil.copytree(TASKS / "hello-file", bad)
    (bad / "solution" / "solve.sh").write_text("#!/bin/bash\ntrue\n")
    (bad / "task.toml").write_text((bad / "task.toml").read_text().replace("hello-file", "hello-unsolved"))
    cfg = make_env_config("tasks", EnvEntry(env={"path": str(tmp_path / "tasks")}))
    ds = build_datasets(cfg, _ctx(renderer, tmp_path, groups_per_batch=2, sandbox=provider))
    assert [b.task.id for b in ds.train.get_batch(0)] == ["hello-file", "hello-file"]
