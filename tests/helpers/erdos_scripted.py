"""A scripted policy for the Erdős env, and a loop that plays it step by step.

The policy answers every prompt with the same program: a hill climb that perturbs the
buffer's construction (`initial_h_values`) and keeps what lowers C₅. Played through the
real env (prompt tokens in, response tokens out, programs in the bwrap sandbox), the
buffer's best C₅ must fall from step to step. Run as a script it plays steps
[start, end) in RUN_DIR and prints one JSON line of metrics per step, so a test can kill it
between steps and start it again.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

HILL_CLIMB_RESPONSE = """I will perturb the current construction and keep every improvement.
```python
def run(seed=0):
    rng = np.random.default_rng(seed)

    def c5(h):
        return np.max(np.correlate(h, 1 - h, mode="full")) * 2 / len(h)

    h = initial_h_values.copy()
    best = c5(h)
    for _ in range(400):
        step = rng.normal(0, 0.03, len(h)) * (rng.random(len(h)) < 0.2)
        cand = np.clip(h + step, 0, 1)
        cand = cand * (len(h) / 2) / cand.sum()
        if cand.max() <= 1 and c5(cand) < best:
            h, best = cand, c5(cand)
    print("C5 =", best)
    return h
```"""


def make_renderer():
    from tinkrl.local.models import DEFAULT_MODEL, load_tokenizer
    from tinkrl.renderers import get_renderer

    return get_renderer(load_tokenizer(DEFAULT_MODEL), DEFAULT_MODEL)


async def play_step(dataset, step: int, renderer, response: str = HILL_CLIMB_RESPONSE) -> dict:
    """One training step's rollouts with the scripted policy; returns the step's metrics."""
    from tinkrl.rl.types import Trajectory, Transition

    tokens = list(renderer.tokenizer.encode(response, add_special_tokens=False))

    async def episode(env) -> Trajectory:
        ob, stop = await env.initial_observation()
        action = tokens + ([stop[0]] if stop and isinstance(stop[0], int) else [])
        result = await env.step(action, stop_reason="stop")
        return Trajectory(
            [
                Transition(
                    ob,
                    action,
                    [0.0] * len(action),
                    result.reward,
                    result.episode_done,
                    metrics=result.metrics,
                    logs=result.logs,
                )
            ]
        )

    for builder in dataset.get_batch(step):
        envs = await builder.make_envs()
        trajectories = await asyncio.gather(*(episode(e) for e in envs))
        await builder.compute_group_rewards(list(trajectories), envs)
        for env in envs:
            await env.close()
    return dataset.batch_metrics(step)


def build(run_dir: Path, renderer, *, n_points: int = 60, seed: int = 0):
    from tinkrl.envs.erdos.config import ErdosEnvConfig
    from tinkrl.envs.erdos.env import build_erdos_dataset
    from tinkrl.sandbox import get_provider

    cfg = ErdosEnvConfig(n_points=n_points, buffer_size=4, epsilon=0.0, timeout_s=10, initial_states=1, parallel_runs=2)
    return build_erdos_dataset(
        cfg,
        renderer=renderer,
        group_size=2,
        groups_per_batch=2,
        run_dir=run_dir,
        seed=seed,
        sandbox_provider=get_provider("bwrap"),
    )


def main(argv: list[str]) -> int:
    run_dir, start, end = Path(argv[0]), int(argv[1]), int(argv[2])
    renderer = make_renderer()
    dataset = build(run_dir, renderer)
    print(json.dumps({"resumed": dataset.search.resumed, "best_c5": dataset.search.buffer.best().c5}), flush=True)
    for step in range(start, end):
        metrics = asyncio.run(play_step(dataset, step, renderer))
        print(json.dumps({"step": step, **metrics}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
