"""Held-out evaluation during training: each environment's test problems, one episode each per mode.

A full eval plays every held-out problem greedily and/or sampled at the run's temperature
(`eval_modes`); an in-run eval plays a fixed sample of them greedily (`eval_sample_size`), so
evaluating often stays cheap. Every mean comes with its standard error, per environment and,
where the held-out builders carry tags of their own, per tag.
"""

from __future__ import annotations

import asyncio
import math
import zlib
from collections.abc import Sequence

import numpy as np

from tinkrl.rl.rollouts import do_rollout
from tinkrl.rl.types import EnvDatasets, EnvGroupBuilder, Metrics, SamplingSettings, Trajectory

FULL, SAMPLE = "eval", "eval_sample"  # the metric prefixes of a full eval and of an in-run sample


def mean_and_stderr(values: Sequence[float]) -> tuple[float, float]:
    """The mean of `values` and its standard error (sample standard deviation / sqrt(n)); NaN where
    there are too few values to say."""
    n = len(values)
    if n == 0:
        return float("nan"), float("nan")
    mean = float(np.mean(values))
    return mean, float(np.std(values, ddof=1) / math.sqrt(n)) if n > 1 else float("nan")


def builder_tag(builder: EnvGroupBuilder, key: str) -> str:
    """The held-out tag a test builder reports under (its first logging tag, else the environment key)."""
    return (builder.logging_tags() or [key])[0]


def _allocate(counts: dict[str, int], size: int) -> dict[str, int]:
    """How many of `size` each tag gets: in proportion to its count, at least one while `size` allows,
    never more than it has."""
    total = sum(counts.values())
    quota = {t: size * n / total for t, n in counts.items()}
    floor = 1 if size >= len(counts) else 0
    alloc = {t: min(n, max(floor, int(quota[t]))) for t, n in counts.items()}
    while sum(alloc.values()) > size:
        largest = max(alloc, key=lambda t: alloc[t])
        alloc[largest] -= 1
    while sum(alloc.values()) < size:
        open_tags = [t for t in counts if alloc[t] < counts[t]]
        alloc[max(open_tags, key=lambda t: quota[t] - alloc[t])] += 1
    return alloc


def fixed_sample(builders: Sequence[EnvGroupBuilder], size: int, seed: int, key: str) -> list[EnvGroupBuilder]:
    """`size` of `builders`, the same ones for the same seed: spread over their tags in proportion to each
    tag's count, drawn within a tag by a permutation seeded by the run's seed and the tag, in their
    original order. All of them when `size` covers them."""
    if size >= len(builders):
        return list(builders)
    by_tag: dict[str, list[int]] = {}
    for i, b in enumerate(builders):
        by_tag.setdefault(builder_tag(b, key), []).append(i)
    alloc = _allocate({t: len(ix) for t, ix in by_tag.items()}, size)
    chosen: list[int] = []
    for tag, indices in by_tag.items():
        order = np.random.default_rng([seed, zlib.crc32(tag.encode())]).permutation(len(indices))
        chosen += [indices[int(j)] for j in order[: alloc[tag]]]
    return [builders[i] for i in sorted(chosen)]


def mode_temperatures(modes: Sequence[str], temperature: float) -> list[tuple[str, float]]:
    """(label, temperature) of each eval mode: greedy at 0, sampled at the run's temperature."""
    return [(m, 0.0 if m == "greedy" else temperature) for m in modes]


def _summarise(prefix: str, key: str, label: str, trajs: list[Trajectory], tags: list[str]) -> Metrics:
    """One mode's metrics for one environment: mean reward (overall and per tag) and accuracy where the env
    reports `correct`, each with its standard error; infrastructure failures are left out."""
    out: Metrics = {}

    def put(name: str, values: list[float]) -> None:
        out[name], out[f"{name}_stderr"] = mean_and_stderr(values)

    put(f"{prefix}/{key}/{label}_reward", [t.total_reward for t in trajs if t.failure_mode is None])
    for tag in sorted(set(tags) - {key}):
        mine = [t.total_reward for t, g in zip(trajs, tags) if g == tag and t.failure_mode is None]
        put(f"{prefix}/{key}/{tag}/{label}_reward", mine)
    correct = [tr.metrics["correct"] for t in trajs for tr in t.transitions if "correct" in tr.metrics]
    if correct:
        put(f"{prefix}/{key}/{label}_correct", correct)
    return out


async def evaluate(
    envs: dict[str, EnvDatasets],
    sampling_client,
    max_tokens: int,
    temperature: float,
    modes: Sequence[str] = ("greedy", "sampled"),
    sample_size: int | None = None,
    seed: int = 0,
    rows: list[dict] | None = None,
) -> Metrics:
    """Each environment's held-out problems, one episode per problem and mode, all at once.

    Full (`sample_size` None): every problem in each of `modes`, as `eval/<key>/{mode}_reward`, per tag
    `eval/<key>/<tag>/{mode}_reward`, and `eval/<key>/{mode}_correct` where the env reports it. In-run
    (`sample_size` set): a fixed sample of that many problems per environment (`fixed_sample`), greedy
    only, under `eval_sample/`. Every mean has a `_stderr` beside it. With `rows`, one row per episode
    is appended to it (`episode_row`), so a run can keep which problems were solved."""
    prefix = FULL if sample_size is None else SAMPLE
    played = mode_temperatures(modes if sample_size is None else ["greedy"], temperature)
    runs: list[tuple[str, str, list[str], list[int]]] = []  # (env key, mode, tags, problem indices)
    episodes = []
    for key, env in envs.items():
        if env.test is None:
            continue
        every = list(env.test.get_batch(0))
        builders = every if sample_size is None else fixed_sample(every, sample_size, seed, key)
        index = {id(b): i for i, b in enumerate(every)}
        tags = [builder_tag(b, key) for b in builders]
        for label, temp in played:
            settings = SamplingSettings(max_tokens, temp)
            runs.append((key, label, tags, [index[id(b)] for b in builders]))
            episodes += [_one_episode(b, sampling_client, settings) for b in builders]
    trajs = await asyncio.gather(*episodes)
    out: Metrics = {}
    at = 0
    for key, label, tags, problems in runs:
        mine = list(trajs[at : at + len(problems)])
        out.update(_summarise(prefix, key, label, mine, tags))
        if rows is not None:
            rows += [episode_row(key, p, tag, label, t) for p, tag, t in zip(problems, tags, mine)]
        at += len(problems)
    return out


def episode_row(key: str, problem: int, tag: str, mode: str, traj: Trajectory) -> dict:
    """One held-out episode as a row of `evals/step_*.jsonl`: the environment, the problem's index in its
    held-out set and its tag, the mode, the reward (None for an infrastructure failure), and what the
    environment logged (agent tasks: the task's id, how the episode ended, the grade, the transcript)."""
    logs = traj.logs
    failed = traj.failure_mode is not None
    return {
        "env": key,
        "problem": problem,
        "tag": tag,
        "mode": mode,
        "reward": None if failed else traj.total_reward,
        "turns": len(traj.transitions),
        **({"failure_mode": traj.failure_mode} if failed else {}),
        **logs,
    }


async def _one_episode(builder: EnvGroupBuilder, sampling_client, settings: SamplingSettings) -> Trajectory:
    """One held-out episode of a problem: the first of the builder's own rollouts, else its first env's."""
    own = await builder.run_group(sampling_client, settings)
    if own is not None:
        return own[0]
    first, *rest = await builder.make_envs()
    for extra in rest:
        await extra.close()
    return await do_rollout(first, sampling_client, settings.max_tokens, settings.temperature)
