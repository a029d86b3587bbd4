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
    """The job's clock: ends RL early, with its final eval and checkpoint, so that the job finishes within
    `budget_s`; keeps in-run evals within `eval_share` of it; and keeps the ledger of where the time went.

    The pace of RL steps is measured from the start of RL (`start_rl`), full evals left out, so the load,
    the warm start and the eval before RL never count as step time. The final eval is reserved from the
    budget at the cost of the latest full eval measured."""

    def __init__(self, budget_s: float | None, t0: float, eval_share: float | None = None):
        self.budget_s, self.t0, self.eval_share = budget_s, t0, eval_share
        self.eval_s = 0.0  # the latest full eval's duration: the final eval's reserve
        self.sample_eval_s = 0.0  # the latest in-run (sample) eval's duration
        self.spent: dict[str, float] = {}  # seconds per phase: warm_start, rl, eval/base, eval/before_rl, ...
        self.rl_start = t0
        self._excluded = 0.0  # full-eval seconds inside RL, left out of the step pace
        self._first: tuple[float, int] | None = None  # (time, steps run) when this process's first step ended

    def start_rl(self) -> None:
        """RL begins now: its steps' pace is measured from here."""
        self.rl_start, self._excluded = time.time(), 0.0

    def expect_final_eval(self, seconds: float) -> None:
        """Reserve `seconds` for the final eval before this process has measured a full eval (a resumed
        run: the cost of the run's eval before RL, as recorded)."""
        self.eval_s = self.eval_s or seconds

    def note(self, phase: str, seconds: float) -> None:
        """Add `seconds` to `phase` in the ledger; an eval phase (`eval/...`) also updates what the next
        evals are expected to cost: `eval/sample` the in-run sample's, any other the final eval's reserve."""
        self.spent[phase] = self.spent.get(phase, 0.0) + seconds
        if phase == "eval/sample":
            self.sample_eval_s = seconds
        elif phase.startswith("eval/"):
            self.eval_s = seconds
            if time.time() - seconds >= self.rl_start:
                self._excluded += seconds

    @property
    def eval_spent(self) -> float:
        """Seconds spent evaluating so far."""
        return sum(v for k, v in self.spent.items() if k.startswith("eval/"))

    def eval_fits(self, sample: bool) -> bool:
        """Whether another in-run eval (a sample or a full one, at its last measured cost) keeps all
        evaluation, the final eval's reserve included, within `eval_share` of the budget (always, without
        a budget or a share)."""
        if self.budget_s is None or self.eval_share is None:
            return True
        cost = self.sample_eval_s if sample else self.eval_s
        return self.eval_spent + cost + self.eval_s <= self.eval_share * self.budget_s

    def note_step(self, steps_run: int) -> None:
        """Record that `steps_run` steps have run in this process. The pace is measured from the end of
        the first one: it carries one-time costs (compiling, the first eval) that the later steps do
        not repeat."""
        if self._first is None and steps_run >= 1:
            self._first = (time.time(), steps_run)

    def _pace(self, steps_run: int) -> tuple[float, float]:
        """Seconds elapsed, and seconds per step: over the steps after the first once there are any,
        else over RL so far (its full evals left out)."""
        now = time.time()
        elapsed = now - self.t0
        if self._first is not None and steps_run > self._first[1]:
            first_end, first_steps = self._first
            return elapsed, (now - first_end) / (steps_run - first_steps)
        return elapsed, (now - self.rl_start - self._excluded) / max(1, steps_run)

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
