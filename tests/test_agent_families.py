"""Agents on every chat family: the tasks env played with replies in each family's own tool-call
format (the tokens its renderer says the model samples), in real sandboxes, graded by the task's
tests. A malformed call comes back to the model as an error observation; three tool turns and a
submit score 1; the episode's prompts extend token for token where the family keeps its past
turns, and where it rewrites them the episode splits into datums, each holding only prompts the
sampler saw and the actions it sampled.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import tinker
from helpers.chat_tokenizers import llama3_tokenizers, missing
from helpers.requirements import needs_bwrap, unless
from helpers.tool_replies import broken_call, call_reply

from tinkrl.local.models import DEFAULT_MODEL, load_tokenizer
from tinkrl.renderers import get_renderer
from tinkrl.rl.data import trajectory_to_sequences
from tinkrl.rl.types import Trajectory, Transition
from tinkrl.taskdirs import load_task

pytestmark = needs_bwrap

TASK = Path(__file__).resolve().parents[1] / "tasks" / "hello-file"
NO_LLAMA = missing("llama_models", "tiktoken")
# one renderer per family (and the variants whose history differs), hand-written ones included
NAMES = [
    "qwen3",
    "qwen3_instruct",
    "qwen3_5",
    "qwen3_8_xhigh_reasoning",
    "deepseekv3",
    "deepseekv4_1",
    "glm5_3_max_reasoning",
    "gpt_oss_no_sysprompt",
    "kimi_k2",
    "kimi_k26_preserve_thinking",
    "nemotron3",
    "tml_v0",
    "smollm2",
    pytest.param("llama3", marks=unless(NO_LLAMA)),
    pytest.param("role_colon", marks=unless(NO_LLAMA)),
]


@pytest.fixture(scope="module")
def provider(bwrap_provider):
    from tinkrl.sandbox import LazyProvider

    return LazyProvider(bwrap_provider)


def renderer_named(name: str):
    tokenizer = {"llama3": "llama", "role_colon": "llama", "smollm2": "smol"}.get(name)
    if tokenizer == "llama":
        tokenizer = llama3_tokenizers()[0]
    elif tokenizer == "smol":
        tokenizer = load_tokenizer(DEFAULT_MODEL)
    return get_renderer(tokenizer, f"test/{name}", name=name)


def bash(renderer, command: str, turn: int) -> dict:
    content = "" if renderer.name == "llama3" else f"Step {turn}."  # Llama 3.1: a call is the whole reply
    return call_reply(
        renderer, "execute_bash", {"command": command}, content, f"Thought {turn}.", f"functions.execute_bash:{turn}"
    )


async def episode(renderer, provider):
    """Returns (the transitions, the last step's result, the observation text after the malformed call)."""
    from tinkrl.agents.episode import SessionEnv
    from tinkrl.agents.session import TaskSession
    from tinkrl.envs.agent_tasks.config import TasksEnvConfig

    env = SessionEnv(TaskSession(load_task(TASK), TasksEnvConfig(), provider), renderer)
    replies = [
        broken_call(renderer, bash(renderer, "ls /app", 0)),
        renderer.action_tokens(bash(renderer, "printf 'Hello, world!\\n' > /app/hello.txt", 1)),
        renderer.action_tokens(bash(renderer, "cat /app/hello.txt", 2)),
        renderer.action_tokens(bash(renderer, "ls /app", 3)),
        renderer.action_tokens(call_reply(renderer, "submit", {}, call_id="functions.submit:4")),
    ]
    transitions, notice = [], ""
    try:
        ob, _ = await env.initial_observation()
        for action in replies:
            result = await env.step(action)
            transitions.append((ob.to_ints(), action))
            if not notice:
                notice = renderer.tokenizer.decode(result.next_observation.to_ints()[len(ob.to_ints()) - 200 :])
            ob = result.next_observation
            if result.episode_done:
                break
    finally:
        await env.close()
    return transitions, result, notice


@pytest.mark.parametrize("name", NAMES)
def test_an_agent_solves_the_task_in_its_familys_format(name, provider):
    r = renderer_named(name)
    transitions, result, notice = asyncio.run(episode(r, provider))
    assert "Error:" in notice  # the malformed call came back to the model as an observation
    assert result.episode_done and result.reward == 1.0, result.logs
    m = result.metrics
    assert (m["tasks/malformed_calls"], m["tasks/tool_calls"], m["tasks/end/submit"]) == (1, 4, 1.0)
    assert len(transitions) == 5

    traj = Trajectory(
        [Transition(tinker.ModelInput.from_ints(ob), ac, [-0.1] * len(ac), 0.0, False) for ob, ac in transitions]
    )
    seqs = trajectory_to_sequences(traj, 1.0)
    breaks = [
        i
        for i in range(1, len(transitions))
        if transitions[i][0][: len(transitions[i - 1][0]) + len(transitions[i - 1][1])]
        != transitions[i - 1][0] + transitions[i - 1][1]
    ]
    assert len(seqs) == 1 + len(breaks)
    if r.keeps_history:  # one datum: every prompt extends the previous prompt + action, but where the family
        # writes the turn's end otherwise: GLM ends the malformed call's turn with `<|observation|>` and the
        # error comes back as a user turn, which GLM opens with `<|user|>` (a new datum, its own rendering)
        assert breaks == ([1] if name.startswith("glm5_3") else [])
    starts = [0, *breaks, len(transitions)]
    for seq, lo, hi in zip(seqs, starts, starts[1:]):
        assert seq.tokens == transitions[hi - 1][0] + transitions[hi - 1][1]
        assert [t for t, m in zip(seq.tokens, seq.mask) if m] == sum((ac for _, ac in transitions[lo:hi]), [])
