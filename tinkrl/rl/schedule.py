"""When things run: rollouts sampled ahead of training (async mode), and when a time budget ends the run."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

SampleStep = Callable[[int, Any], Awaitable[Any]]  # (step, sampling client) -> that step's groups


class RolloutQueue:
    """Each step's rollouts; in async mode also the next `max_lag` steps', started with the weights
    current at the time, so training never waits for sampling and no rollout comes from weights more
    than `max_lag` optimizer steps old."""

    def __init__(self, sample_step: SampleStep, max_steps: int, max_lag: int):
        self.sample_step, self.max_steps, self.max_lag = sample_step, max_steps, max_lag
        self._inflight: dict[int, tuple[asyncio.Future, int]] = {}  # step -> (its rollouts, weights version used)

    def _start(self, step: int, sampling_client: Any, weights_step: int) -> None:
        if step not in self._inflight:
            self._inflight[step] = (asyncio.ensure_future(self.sample_step(step, sampling_client)), weights_step)

    async def take(self, step: int, sampling_client: Any, weights_step: int) -> tuple[Any, int]:
        """`step`'s rollouts (sampled now unless already in flight) and the weights version they used;
        then, in async mode, starts the steps ahead with `sampling_client`."""
        self._start(step, sampling_client, weights_step)
        rollouts, sampled_with = self._inflight.pop(step)
        groups = await rollouts
        for ahead in range(step + 1, min(step + 1 + self.max_lag, self.max_steps)):
            self._start(ahead, sampling_client, weights_step)
        return groups, sampled_with

    def cancel(self) -> None:
        """Drop rollouts started for steps that will not run."""
        for task, _ in self._inflight.values():
            task.cancel()
        self._inflight.clear()


class TimeBudget:
    """Ends a run early, with its final eval and checkpoint, so that it finishes within `budget_s`."""

    def __init__(self, budget_s: float | None, t0: float):
        self.budget_s, self.t0 = budget_s, t0
        self.eval_s = 0.0  # one held-out eval, as first measured: the final eval is estimated by it

    def note_eval(self, seconds: float) -> None:
        """Record the first eval's duration."""
        self.eval_s = self.eval_s or seconds

    def exhausted(self, steps_run: int) -> bool:
        """Would another step (plus the final eval) overrun the budget?"""
        if self.budget_s is None:
            return False
        elapsed = time.time() - self.t0
        per_step = (elapsed - self.eval_s) / max(1, steps_run)
        return elapsed + per_step + self.eval_s > self.budget_s
