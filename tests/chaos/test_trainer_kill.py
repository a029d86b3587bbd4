"""SIGKILL of `tinkrl train` inside each phase of a step, then resume.

What must hold after any kill and after the resumed run: `metrics.jsonl` has every step once,
in order (no step lost, none repeated); `checkpoints.jsonl` rows rise strictly and each names a
complete checkpoint whose optimizer step equals its row's step count; a row only follows its
step's metrics line; no line of either file is cut short; a step re-run after the resume trains
on the same problems as the killed attempt at it (the data position is restored); and the final
checkpoint has taken exactly `max_steps` optimizer steps.

The kill lands exactly in its phase: `phase_stop.py` freezes the run there (SIGSTOP) and the test
SIGKILLs the frozen process. Which occurrence of the phase is drawn from a fixed seed.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from helpers.chaos import assert_consistent, jsonl_rows, kill_at, train

SEED = 19
PHASES = ["sample", "train", "save_state", "save_sampler", "log", "commit"]


def problems_by_step(run: Path) -> dict[int, list[str]]:
    """The problems each step's episodes were on, from `episodes/step_*.jsonl`."""
    out = {}
    for f in sorted((run / "episodes").glob("step_*.jsonl")):
        rows = jsonl_rows(f)
        out[int(f.stem.split("_")[1])] = sorted(r["problem_id"] for r in rows)
    return out


def kill_and_check(home: Path, tmp_path: Path, run: Path, phase: str, nth: int, argv: list[str], seen: dict) -> None:
    """Kill the run at the `nth` `phase`; check the invariants and remember which problems each step saw."""
    kill_at(home, tmp_path, phase, nth, *argv)
    logged, committed = assert_consistent(run, home)
    assert committed <= logged
    for step, problems in problems_by_step(run).items():
        assert seen.setdefault(step, problems) == problems, f"step {step} re-ran on other problems"


def resume_to_the_end(home: Path, tmp_path: Path, run: Path, argv: list[str], steps: int, seen: dict) -> None:
    _, committed = assert_consistent(run, home)
    out = train(home, tmp_path, *argv)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    if committed:
        assert f"(step {committed})" in out.stdout and f"steps {committed}..{steps}" in out.stdout
    logged, last = assert_consistent(run, home)
    assert (logged, last) == (steps, steps)
    rows = jsonl_rows(run / "checkpoints.jsonl")
    assert rows[-1]["final"] and [r["batch"] for r in rows] == list(range(1, steps + 1))
    for step, problems in problems_by_step(run).items():
        assert seen.setdefault(step, problems) == problems, f"step {step} re-ran on other problems"
    assert sorted(seen) == list(range(steps))


def test_sigkill_while_saving_state_then_resume(home, tmp_path):
    """The delicate phase: a half-written checkpoint directory must never be resumed from."""
    run, steps = tmp_path / "run", 3
    argv = [f"max_steps={steps}", f"log_path={run}"]
    nth = random.Random(SEED).randint(2, steps)  # the save of step 2 or 3: one checkpoint committed before
    seen: dict = {}
    kill_and_check(home, tmp_path, run, "save_state", nth, argv, seen)
    resume_to_the_end(home, tmp_path, run, argv, steps, seen)


@pytest.mark.slow  # seven runs of the tiny model, ~3-5 min
def test_sigkill_in_every_phase_in_turn_then_resume(home, tmp_path):
    """One run killed in each phase in turn (a seeded order and occurrence), resumed after each kill."""
    rng = random.Random(SEED)
    order = rng.sample(PHASES, len(PHASES))
    run, steps = tmp_path / "run", 8
    argv = [f"max_steps={steps}", f"log_path={run}"]
    seen: dict = {}
    for phase in order:
        kill_and_check(home, tmp_path, run, phase, rng.randint(1, 2), argv, seen)
        assert assert_consistent(run, home)[1] < steps, "the run ended before every phase was faulted"
    resume_to_the_end(home, tmp_path, run, argv, steps, seen)
