"""Groups that run their own rollouts: an agent calling the run's OpenAI server, its tokens captured,
taken by training rollouts and held-out evals like token-level episodes."""

from __future__ import annotations

import asyncio
import threading

import openai
import pytest

from tinkrl.envs.external_agent.run_server import RunServer
from tinkrl.local import ServiceClient
from tinkrl.local.models import TINY_MODEL
from tinkrl.rl.evaluation import evaluate
from tinkrl.rl.rollouts import do_group_rollout, gather_rollouts
from tinkrl.rl.types import EnvDatasets, EnvGroupBuilder, RLDataset, SamplingSettings, Trajectory


class AgentGroup(EnvGroupBuilder):
    """`size` rollouts of a one-call agent; reward 1 when the reply has at least `min_chars` characters."""

    def __init__(self, server: RunServer, size: int, fail_first: bool = False, min_chars: int = 1):
        self.server, self.size, self.fail_first, self.min_chars = server, size, fail_first, min_chars
        self.seen: list[SamplingSettings] = []
        self.running, self.most_at_once = 0, 0
        self.lock = threading.Lock()

    async def make_envs(self):
        raise AssertionError("a group that runs its own rollouts is never asked for envs")

    async def run_group(self, sampling_client, settings: SamplingSettings) -> list[Trajectory]:
        self.seen.append(settings)
        runner = self.server.runner(sampling_client)
        replies: list[str] = []

        def agent(session) -> None:
            with self.lock:
                self.running += 1
                self.most_at_once = max(self.most_at_once, self.running)
            try:
                talk(session)
            finally:
                with self.lock:
                    self.running -= 1

        def talk(session) -> None:
            client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
            reply = client.chat.completions.create(
                model=session.model,
                messages=[{"role": "user", "content": "Say something."}],
                max_tokens=settings.max_tokens,
                temperature=settings.temperature,
            )
            replies.append(reply.choices[0].message.content or "")

        def broken(session) -> None:
            raise RuntimeError("the agent program crashed")

        rollouts = await gather_rollouts(  # the run's max_concurrent_rollouts, as the real builders
            settings,
            self.size,
            lambda i: runner.run(broken if (self.fail_first and i == 0) else agent, grader=lambda: 0.0),
        )
        trajectories = [r.trajectory for r in rollouts]
        for t in trajectories:  # the reward this test's grader gives, from what was sampled
            if t.transitions:
                t.transitions[-1].reward = float(len(t.transitions[-1].ac_tokens) >= self.min_chars)
        return trajectories


class Fixed(RLDataset):
    def __init__(self, builders):
        self.builders = builders

    def get_batch(self, index: int):
        return self.builders

    def __len__(self) -> int:
        return 1


@pytest.fixture(scope="module")
def sampling_client():
    service = ServiceClient()
    return service.create_sampling_client(base_model=TINY_MODEL)


def test_a_group_of_agent_rollouts_is_captured_and_its_failure_kept_apart(sampling_client) -> None:
    server = RunServer(TINY_MODEL)
    try:
        builder = AgentGroup(server, size=3, fail_first=True)
        group = asyncio.run(do_group_rollout(builder, sampling_client, max_tokens=6, temperature=1.0))
        assert builder.seen == [SamplingSettings(6, 1.0, 1.0)]
        assert len(group.trajectories_G) == 2 and len(group.failures) == 1
        assert group.failures[0].failure_mode == "agent_error"
        for t in group.trajectories_G:
            (turn,) = t.transitions
            assert 1 <= len(turn.ac_tokens) <= 6 and len(turn.ac_logprobs) == len(turn.ac_tokens)
            assert all(lp <= 0.0 for lp in turn.ac_logprobs)
        assert group.total_rewards() == [1.0, 1.0]
    finally:
        server.close()
    assert server.url == ""


def test_a_group_that_runs_its_own_rollouts_gets_the_runs_rollout_cap(sampling_client) -> None:
    server = RunServer(TINY_MODEL)

    async def capped(builder: AgentGroup):
        slots = asyncio.Semaphore(1)
        group = await do_group_rollout(builder, sampling_client, max_tokens=4, temperature=1.0, semaphore=slots)
        return group, slots

    try:
        builder = AgentGroup(server, size=3)
        group, slots = asyncio.run(capped(builder))
        assert builder.seen[0].slots is slots
        assert len(group.trajectories_G) == 3 and builder.most_at_once == 1
    finally:
        server.close()


def test_the_server_follows_the_steps_policy(sampling_client) -> None:
    server = RunServer(TINY_MODEL)
    service = ServiceClient()
    try:
        server.runner(sampling_client)
        url, version = server.url, server._server.policy.version
        server.runner(sampling_client)  # the same policy: no swap
        assert server._server.policy.version == version
        newer = service.create_sampling_client(base_model=TINY_MODEL)
        server.runner(newer)
        assert server.url == url and server._server.policy.version == version + 1
        assert server._server.policy.client is newer
    finally:
        server.close()


def test_held_out_evals_take_one_rollout_of_a_group_that_runs_its_own(sampling_client) -> None:
    server = RunServer(TINY_MODEL)
    try:
        builders = [AgentGroup(server, size=1), AgentGroup(server, size=1, min_chars=10_000)]
        metrics = asyncio.run(
            evaluate({"agent": EnvDatasets(train=Fixed([]), test=Fixed(builders))}, sampling_client, 4, 1.0)
        )
        assert metrics["eval/agent/greedy_reward"] == 0.5 and metrics["eval/agent/sampled_reward"] == 0.5
        assert [s.temperature for s in builders[0].seen] == [0.0, 1.0]
    finally:
        server.close()
