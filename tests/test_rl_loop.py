"""The loop's per-environment settings: each environment's groups sample at its own temperature, and
each environment's failure limit decides which of its groups are dropped (the config entry is the one
owner of both)."""

from __future__ import annotations

import asyncio

import tinker
from helpers.sampled import response_of
from tinker import types

from tinkrl.config import load_config
from tinkrl.errors import InfraFailure
from tinkrl.rl.data import select_groups
from tinkrl.rl.rollouts import sample_groups
from tinkrl.rl.types import Env, EnvDatasets, EnvGroupBuilder, RLDataset, StepResult, Trajectory, TrajectoryGroup


class OneTurn(Env):
    def __init__(self, fail: bool = False):
        self.fail = fail

    async def initial_observation(self):
        return tinker.ModelInput.from_ints([1, 2, 3]), [0]

    async def step(self, action, *, stop_reason="stop"):
        if self.fail:
            raise InfraFailure("the sandbox died", "sandbox_died")
        return StepResult(float(len(action)), True, tinker.ModelInput.empty(), [0])


class Group(EnvGroupBuilder):
    def __init__(self, size: int, failing: int = 0):
        self.size, self.failing = size, failing

    async def make_envs(self):
        return [OneTurn(fail=i < self.failing) for i in range(self.size)]


class Batches(RLDataset):
    def __init__(self, groups: int, size: int):
        self.groups, self.size = groups, size

    def get_batch(self, index):
        return [Group(self.size) for _ in range(self.groups)]

    def __len__(self):
        return 1


class RecordingSampler:
    """Answers every sample with as many tokens as the temperature's tenths, so rewards show the temperature."""

    def __init__(self):
        self.temperatures: list[float] = []

    async def sample(self, prompt, num_samples, params: types.SamplingParams):
        self.temperatures.append(params.temperature)
        return response_of(round(params.temperature * 10))


def test_each_environment_samples_at_its_own_temperature():
    config = load_config(
        None,
        [
            "temperature=0.3",
            "environments.a.type=arithmetic",
            "environments.b.type=arithmetic",
            "environments.b.temperature=0.8",
            "batch_size=8",
            "group_size=2",
        ],
    )
    envs = {"a": EnvDatasets(train=Batches(2, 2)), "b": EnvDatasets(train=Batches(2, 2))}
    sampler = RecordingSampler()
    keyed = asyncio.run(sample_groups(envs, 0, sampler, config, asyncio.Semaphore(8)))
    assert [k for k, _ in keyed] == ["a", "a", "b", "b"]
    rewards = {key: {r for k, g in keyed if k == key for r in g.total_rewards()} for key in "ab"}
    assert rewards == {"a": {3.0}, "b": {8.0}}
    assert sorted(set(sampler.temperatures)) == [0.3, 0.8]


def test_each_environment_drops_groups_over_its_own_failure_limit():
    ok = Trajectory([], None)
    failed = Trajectory([], None, failure_mode="sandbox_died")

    def group(failures: int) -> TrajectoryGroup:
        return TrajectoryGroup([ok, ok], [1.0, 0.0], [{}, {}], [], [failed] * failures)

    keyed = [("strict", group(1)), ("lenient", group(1)), ("lenient", group(2)), ("strict", group(0))]
    kept, metrics = select_groups(keyed, {"strict": 0, "lenient": 1}, remove_constant=False)
    assert [k for k, _ in kept] == ["lenient", "strict"]
    assert metrics["groups/dropped_failing"] == 2 and metrics["groups/kept"] == 2
