"""Held-out evaluation during training: each environment's test problems, one episode each."""

from __future__ import annotations

import asyncio

import numpy as np

from tinkrl.rl.rollouts import do_rollout
from tinkrl.rl.types import EnvDatasets, EnvGroupBuilder, Metrics, SamplingSettings, Trajectory


async def evaluate(envs: dict[str, EnvDatasets], sampling_client, max_tokens: int, temperature: float) -> Metrics:
    """Greedy and sampled (at `temperature`) reward, and accuracy where the env reports `correct`,
    on each environment's held-out problems: `eval/<key>/{greedy,sampled}_{reward,correct}`; where the
    held-out builders carry tags of their own (e.g. shell: heldout_instances, heldout_templates), also
    `eval/<key>/<tag>/{greedy,sampled}_reward` per tag."""
    out: Metrics = {}
    for key, env in envs.items():
        if env.test is None:
            continue
        builders = list(env.test.get_batch(0))
        for label, temp in (("greedy", 0.0), ("sampled", temperature)):
            settings = SamplingSettings(max_tokens, temp)
            trajs = await asyncio.gather(*(_one_episode(b, sampling_client, settings) for b in builders))
            rewards = [t.total_reward for t in trajs if t.failure_mode is None]
            out[f"eval/{key}/{label}_reward"] = float(np.mean(rewards)) if rewards else float("nan")
            tags = [(b.logging_tags() or [key])[0] for b in builders]
            for tag in sorted(set(tags) - {key}):
                mine = [t.total_reward for t, g in zip(trajs, tags) if g == tag and t.failure_mode is None]
                out[f"eval/{key}/{tag}/{label}_reward"] = float(np.mean(mine)) if mine else float("nan")
            correct = [tr.metrics["correct"] for t in trajs for tr in t.transitions if "correct" in tr.metrics]
            if correct:
                out[f"eval/{key}/{label}_correct"] = float(np.mean(correct))
    return out


async def _one_episode(builder: EnvGroupBuilder, sampling_client, settings: SamplingSettings) -> Trajectory:
    """One held-out episode of a problem: the first of the builder's own rollouts, else its first env's."""
    own = await builder.run_group(sampling_client, settings)
    if own is not None:
        return own[0]
    first, *rest = await builder.make_envs()
    for extra in rest:
        await extra.close()
    return await do_rollout(first, sampling_client, settings.max_tokens, settings.temperature)
