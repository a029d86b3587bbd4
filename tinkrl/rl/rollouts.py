"""Running episodes: one env through the policy, and a GRPO group of them, concurrently.

What the policy causes (turn/token limits, a stop for length, a broken tool call) is part of
the episode. Only infrastructure failures (`InfraFailure`: a dead sandbox or env server, a
transport error) become a trajectory's `failure_mode`: recorded, left out of the group, never
scored as reward 0. A group with more failures than its environment's `max_failing_rollouts`
is dropped by the trainer and counted.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tinker import types

from tinkrl.config import TrainConfig
from tinkrl.errors import InfraFailure
from tinkrl.progress import progress_bar
from tinkrl.rl.types import (
    Env,
    EnvDatasets,
    EnvGroupBuilder,
    SamplingSettings,
    Trajectory,
    TrajectoryGroup,
    Transition,
)

log = logging.getLogger(__name__)
T = TypeVar("T")


async def gather_rollouts(settings: SamplingSettings, count: int, rollout: Callable[[int], Awaitable[T]]) -> list[T]:
    """`rollout(0)` .. `rollout(count - 1)` at once, each holding a slot of the run's cap on rollouts at
    once (`settings.slots`): how a group runs its rollouts, also a group that runs them itself."""

    async def one(i: int) -> T:
        if settings.slots is None:
            return await rollout(i)
        async with settings.slots:
            return await rollout(i)

    return list(await asyncio.gather(*(one(i) for i in range(count))))


async def do_rollout(env: Env, sampling_client, max_tokens: int, temperature: float, top_p: float = 1.0) -> Trajectory:
    """One episode of `env` through the sampling client; an InfraFailure becomes the trajectory's failure_mode."""
    transitions: list[Transition] = []
    try:
        ob, stop = await env.initial_observation()
        while True:
            params = types.SamplingParams(
                max_tokens=env.max_tokens(max_tokens), temperature=temperature, top_p=top_p, stop=stop
            )
            resp = await sampling_client.sample(ob, 1, params)
            seq = resp.sequences[0]
            step = await env.step(list(seq.tokens), stop_reason=seq.stop_reason)
            transitions.append(
                Transition(
                    ob,
                    list(seq.tokens),
                    list(seq.logprobs or []),
                    step.reward,
                    step.episode_done,
                    seq.stop_reason,
                    step.action_mask,
                    step.metrics,
                    step.logs,
                )
            )
            if step.episode_done:
                return Trajectory(transitions, step.next_observation)
            ob, stop = step.next_observation, step.next_stop_condition
    except InfraFailure as e:
        return Trajectory(transitions, None, failure_mode=e.failure_mode, failure_detail=str(e))
    finally:
        try:
            await env.close()
        except Exception:  # closing must never take the run down
            log.warning("env.close failed:\n%s", traceback.format_exc())


async def do_group_rollout(
    builder: EnvGroupBuilder,
    sampling_client,
    max_tokens: int,
    temperature: float,
    top_p: float = 1.0,
    semaphore: asyncio.Semaphore | None = None,
) -> TrajectoryGroup:
    """The `group_size` episodes of one task, run concurrently (at most `semaphore`'s count at once),
    with group-level rewards; episodes with an infrastructure failure go to `failures`."""

    settings = SamplingSettings(max_tokens, temperature, top_p, semaphore)

    try:
        own = await builder.run_group(sampling_client, settings)
        if own is not None:  # the builder ran its rollouts itself (external agents)
            envs, trajectories = [], own
        else:
            envs = await builder.make_envs()
            trajectories = await gather_rollouts(
                settings, len(envs), lambda i: do_rollout(envs[i], sampling_client, max_tokens, temperature, top_p)
            )
        ok = [t for t in trajectories if t.failure_mode is None]
        failed = [t for t in trajectories if t.failure_mode is not None]
        ok_envs = [e for e, t in zip(envs, trajectories) if t.failure_mode is None]
        group_rewards = await builder.compute_group_rewards(ok, ok_envs) if ok else []
    except InfraFailure as e:
        failed, ok, group_rewards = [Trajectory([], None, e.failure_mode, str(e))], [], []
    finally:
        await builder.cleanup()
    return TrajectoryGroup(
        ok, [r for r, _ in group_rewards], [m for _, m in group_rewards], builder.logging_tags(), failed
    )


async def sample_groups(
    envs: dict[str, EnvDatasets], step: int, sampling_client, config: TrainConfig, semaphore: asyncio.Semaphore
) -> list[tuple[str, TrajectoryGroup]]:
    """Every environment's groups of `step`, rolled out concurrently: (environment key, group) pairs."""
    jobs = [(key, builder) for key, env in envs.items() for builder in env.train.get_batch(step)]

    def temperature(key: str) -> float:
        own = config.environments[key].temperature
        return config.temperature if own is None else own

    bar = progress_bar(len(jobs), f"sample step {step}", unit="group", leave=False)

    async def one(key: str, builder: EnvGroupBuilder) -> TrajectoryGroup:
        group = await do_group_rollout(
            builder, sampling_client, config.max_tokens, temperature(key), config.top_p, semaphore
        )
        bar.update(1)
        return group

    try:
        groups = await asyncio.gather(*(one(key, b) for key, b in jobs))
    finally:
        bar.close()
    return [(key, g) for (key, _), g in zip(jobs, groups)]
