"""End to end: an agent that only knows the OpenAI API solves a shipped task through the server,
the trainer captures its tokens, and one training step is made from them."""

from __future__ import annotations

import asyncio
import json
import math
import sys
from pathlib import Path

import numpy as np
import openai
import pytest
from helpers.requirements import needs_bwrap
from test_proxy_helpers import AGENT_SYSTEM, AGENT_TOOLS, HELLO_COMMAND, tool_policy
from tinker import types

from tinkrl.agents.tools import run_tool
from tinkrl.envs.external_agent.runner import AgentSession, CommandAgent, ExternalAgentRunner
from tinkrl.local import ServiceClient
from tinkrl.local.models import TINY_MODEL
from tinkrl.proxy.server import ProxyServer, serve_in_thread
from tinkrl.rl.data import trajectory_to_sequences
from tinkrl.taskdirs import load_task

TASKS = Path(__file__).resolve().parents[1] / "tasks"


def openai_agent(session: AgentSession) -> None:
    """A plain tool-calling agent, as a user writes one: it knows a base URL, a key and a model name."""
    client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0, timeout=300)
    messages = [{"role": "system", "content": AGENT_SYSTEM}, {"role": "user", "content": session.instruction}]
    for _turn in range(3):
        reply = client.chat.completions.create(
            model=session.model, messages=messages, tools=AGENT_TOOLS, temperature=0, max_tokens=64
        )
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            messages.append({"role": "user", "content": "Please use the tools; call submit when done."})
            continue
        for call in message.tool_calls:
            observation, done = run_tool(session.sandbox, call.function.name, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": observation})
            if done:
                return


@pytest.fixture(scope="module")
def env():
    service = ServiceClient()
    task = load_task(TASKS / "hello-file")
    tc, policy = tool_policy(service)
    server = ProxyServer(policy, model_name=TINY_MODEL, service_client=service)
    with serve_in_thread(server) as url:
        yield {"server": server, "url": url, "tc": tc, "task": task}


@needs_bwrap
def test_openai_agent_solves_a_task_and_its_tokens_train(env):
    from tinkrl.sandbox import get_provider

    server, tc = env["server"], env["tc"]
    runner = ExternalAgentRunner(server, env["url"])
    rollout = asyncio.run(runner.run_task(openai_agent, env["task"], get_provider("bwrap"), timeout_s=600))

    assert rollout.trajectory.failure_mode is None, rollout.trajectory.failure_detail
    assert rollout.reward == 1.0, rollout.grade_detail  # the grader ran the task's tests
    first = rollout.trajectory.transitions[0]
    first_text = server.tokenizer.decode(first.ac_tokens)
    assert json.dumps(HELLO_COMMAND)[1:-1] in first_text  # the model's own call did the work
    assert len(rollout.trajectory.transitions) == 3 and rollout.trajectory.transitions[-1].reward == 1.0
    assert rollout.stats.merge_rate == 1.0 and rollout.stats.chains == 1
    assert rollout.stats.splice_rate == 1.0 and rollout.stats.assistant_messages == 0 + 1 + 2
    assert server.capture.calls(rollout.rollout_id) == []  # popped by the runner

    seqs = trajectory_to_sequences(rollout.trajectory, advantage=1.0)
    assert len(seqs) == 1  # three calls, one datum
    datum = seqs[0].to_datum()
    mask = seqs[0].action_mask.astype(bool)
    out = tc.forward_backward([datum], "importance_sampling").result()
    train_lp = np.asarray(out.loss_fn_outputs[0]["logprobs"].to_numpy())
    sampler_lp = np.asarray(datum.loss_fn_inputs["logprobs"].to_numpy())
    # On-policy: the trainer's logprobs of the captured tokens are the sampler's.
    assert np.abs(train_lp[mask] - sampler_lp[mask]).max() < 0.05
    assert math.isfinite(out.metrics["loss:sum"])
    tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    new_policy = tc.save_weights_and_get_sampling_client("after-proxy-step")
    assert server.set_sampling_client(new_policy) == 1


AGENT_SCRIPT = """
import os, openai
client = openai.OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
model = os.environ["OPENAI_MODEL"]
messages = [{"role": "user", "content": os.environ["TINKRL_INSTRUCTION"]}]
for _ in range(2):
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=5, seed=1)
    messages += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "and?"}]
"""


def test_command_agent_is_captured_per_rollout(env):
    runner = ExternalAgentRunner(env["server"], env["url"])
    agent = CommandAgent([sys.executable, "-c", AGENT_SCRIPT])
    rollout = asyncio.run(runner.run(agent, grader=lambda: 0.25, instruction="count to three"))
    assert rollout.trajectory.failure_mode is None
    assert len(rollout.trajectory.transitions) == 2 and rollout.stats.merge_rate == 1.0
    assert rollout.trajectory.total_reward == 0.25

    broken = asyncio.run(runner.run(CommandAgent([sys.executable, "-c", "raise SystemExit(3)"]), grader=lambda: 1.0))
    assert broken.trajectory.failure_mode == "agent_error" and "exited 3" in broken.trajectory.failure_detail
