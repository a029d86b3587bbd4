"""The agent turn, written once: a harness episode (`run_episode`) is the training env's turn.

A checkpoint policy served by `tinkrl serve tinker` plays a task in a real bubblewrap sandbox through
`harness.policy.run_episode`; every turn it records (read through `episode_record`, the trajectory
file's layout) must be what the token bridge (`SessionEnv`) lays out: each prompt extends the one
before it with the sampled tokens and the rendered observations, and the transcript holds one
assistant message per recorded turn.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from helpers.requirements import needs_bwrap

from tinkrl.agents.limits import EpisodeLimits
from tinkrl.agents.session import END_REASONS
from tinkrl.local import ServiceClient as LocalServiceClient
from tinkrl.local.models import TINY_MODEL
from tinkrl.taskdirs import load_task, start_sandbox
from tinkrl.tinker_server.app import TinkerServer, serve_in_thread

TASKS = Path(__file__).resolve().parents[1] / "tasks"


@pytest.fixture(scope="module")
def engine() -> LocalServiceClient:
    return LocalServiceClient()


@needs_bwrap
@pytest.mark.parametrize("action_format", ["shell", "tools"])
def test_a_harness_episode_takes_the_training_envs_turns(engine, bwrap_provider, action_format):
    from tinkrl.harness.policy import CheckpointPolicy, episode_record, harness_task, run_episode

    task = load_task(TASKS / "hello-file")
    sandbox = start_sandbox(task, bwrap_provider)
    limits = EpisodeLimits(max_turns=3, max_context_tokens=4096, action_format=action_format)
    try:
        with serve_in_thread(server=TinkerServer(engine)) as url:
            policy = CheckpointPolicy(
                TINY_MODEL, base_url=url, api_key="tml-local", max_tokens_per_turn=24, action_format=action_format
            )
            with policy:
                played = asyncio.run(
                    run_episode(policy, sandbox, harness_task(task.id, task.instruction, task.workdir), limits)
                )
                traj = episode_record(policy, played)
    finally:
        sandbox.close()
    assert traj["end_reason"] in END_REASONS and 1 <= len(traj["turns"]) <= limits.max_turns
    assistant = [m for m in traj["messages"] if m["role"] == "assistant"]
    assert [m["content"] for m in assistant] == [t["text"] for t in traj["turns"]]
    for before, after in zip(traj["turns"], traj["turns"][1:]):
        grown = before["prompt_tokens"] + before["sampled_tokens"]
        assert after["prompt_tokens"][: len(grown)] == grown and len(after["prompt_tokens"]) > len(grown)
        assert before["observations"]  # every turn that did not end the episode was answered
    assert all(len(t["sampled_tokens"]) == len(t["logprobs"]) <= 24 for t in traj["turns"])
