"""The learning-rate schedule: its shapes and its clock (max_steps, or where the time budget will end
the run); tests/test_train_cli.py checks a real run applies it."""

from __future__ import annotations

import math
import time

import pytest

from tinkrl.config import load_config
from tinkrl.rl.schedule import TimeBudget, lr_multiplier, run_progress


def test_shapes():
    for schedule in ("constant", "linear", "cosine"):
        assert lr_multiplier(schedule, 0.0) == 1.0
    assert lr_multiplier("constant", 0.9) == 1.0
    assert lr_multiplier("linear", 0.25) == pytest.approx(0.75)
    assert lr_multiplier("cosine", 0.5) == pytest.approx(0.5)
    assert lr_multiplier("cosine", 0.25) == pytest.approx((1 + math.cos(math.pi / 4)) / 2)
    for schedule in ("linear", "cosine"):
        assert lr_multiplier(schedule, 1.0) == pytest.approx(0.0)
        assert lr_multiplier(schedule, 1.5) == pytest.approx(0.0)  # clamped, never negative
    with pytest.raises(ValueError, match="unknown lr_schedule 'step'"):
        lr_multiplier("step", 0.5)


def test_config_rejects_unknown_schedule():
    with pytest.raises(Exception, match="lr_schedule"):
        load_config(None, ["env=arithmetic", "lr_schedule=exponential"])


def test_clock_without_budget_is_step_count():
    budget = TimeBudget(None, time.time())
    assert run_progress(0, 0, 100, budget) == 0.0
    assert run_progress(50, 0, 100, budget) == 0.5
    assert run_progress(75, 50, 100, budget) == 0.75  # a resumed run keeps the whole run's clock


def test_clock_follows_the_time_budget():
    # 10 steps took 10 s of a 40 s budget: 30 more fit, so the run ends near step 40, not at max_steps
    budget = TimeBudget(40.0, time.time() - 10.0)
    assert run_progress(10, 0, 1000, budget) == pytest.approx(10 / 40, abs=0.01)
    # a budget that max_steps ends first leaves the step clock as it is
    assert run_progress(10, 0, 20, budget) == pytest.approx(0.5)
    # after the budget's end the run is at its end
    late = TimeBudget(5.0, time.time() - 10.0)
    assert run_progress(10, 0, 1000, late) == 1.0


def test_clock_leaves_the_first_steps_one_time_costs_out(monkeypatch):
    # Loading and compiling make the first step 60 s; the steps after it take 5 s. The clock must
    # expect (560 - elapsed) / 5 more steps, not divide by an average that the first step inflates.
    now = [1000.0]
    monkeypatch.setattr("tinkrl.rl.schedule.time.time", lambda: now[0])
    budget = TimeBudget(560.0, t0=1000.0)
    now[0] += 60.0
    budget.note_step(1)
    assert budget.steps_left(1) == pytest.approx(500 / 60)  # one step: nothing better to go by yet
    now[0] += 9 * 5.0
    budget.note_step(10)
    assert budget.steps_left(10) == pytest.approx((560 - 105) / 5.0)
    assert run_progress(10, 0, 1000, budget) == pytest.approx(10 / (10 + 91))
    assert not budget.exhausted(10)
    now[0] = 1000.0 + 556.0  # 4 s left, steps of ~4.6 s: another would overrun
    assert budget.exhausted(10 + 99)
