"""When things run: rollouts sampled ahead of training (async mode), when a time budget ends the run,
and how far through the run a step is (the learning-rate schedule's clock)."""

from __future__ import annotations

import asyncio
import math
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
        self._first: tuple[float, int] | None = None  # (time, steps run) when this process's first step ended

    def note_eval(self, seconds: float) -> None:
        """Record the first eval's duration."""
        self.eval_s = self.eval_s or seconds

    def note_step(self, steps_run: int) -> None:
        """Record that `steps_run` steps have run in this process. The pace is measured from the end of
        the first one: it carries one-time costs (loading the model, compiling, the first eval) that
        the later steps do not repeat."""
        if self._first is None and steps_run >= 1:
            self._first = (time.time(), steps_run)

    def _pace(self, steps_run: int) -> tuple[float, float]:
        """Seconds elapsed, and seconds per step: over the steps after the first once there are any,
        else over everything so far (the first eval left out)."""
        now = time.time()
        elapsed = now - self.t0
        if self._first is not None and steps_run > self._first[1]:
            first_end, first_steps = self._first
            return elapsed, (now - first_end) / (steps_run - first_steps)
        return elapsed, (elapsed - self.eval_s) / max(1, steps_run)

    def steps_left(self, steps_run: int) -> float:
        """How many more steps fit in the budget at the pace so far (inf without a budget or before a step)."""
        if self.budget_s is None or steps_run < 1:
            return math.inf
        elapsed, per_step = self._pace(steps_run)
        return max(0.0, (self.budget_s - elapsed - self.eval_s) / max(per_step, 1e-9))

    def exhausted(self, steps_run: int) -> bool:
        """Would another step (plus the final eval) overrun the budget?"""
        if self.budget_s is None:
            return False
        elapsed, per_step = self._pace(steps_run)
        return elapsed + per_step + self.eval_s > self.budget_s


LR_SCHEDULES = ("constant", "linear", "cosine")


def lr_multiplier(schedule: str, progress: float) -> float:
    """The learning rate's factor at `progress` (0 at the first step, 1 at the end of the run):
    constant 1; linear and cosine decay from 1 to 0."""
    p = min(1.0, max(0.0, progress))
    if schedule == "linear":
        return 1.0 - p
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * p))
    if schedule == "constant":
        return 1.0
    raise ValueError(f"unknown lr_schedule {schedule!r}; one of {', '.join(LR_SCHEDULES)}")


def run_progress(step: int, start: int, max_steps: int, budget: TimeBudget) -> float:
    """How far through the run `step` is: its share of the steps the run will take, which is max_steps
    or, when the time budget will end the run first, the steps run so far plus those that fit in it."""
    total = float(max_steps)
    left = budget.steps_left(step - start)
    if step + left < total:
        total = step + left
    return step / max(total, 1.0)
