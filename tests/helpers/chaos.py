"""The reliability sweep's shared pieces (tests/chaos/): real `tinkrl train` processes on the tiny model,
stopped at a chosen phase of a step (`phase_stop.py`) and killed or let go on, and their JSONL files read
strictly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from helpers.engine import TINY

REPO = Path(__file__).resolve().parents[2]
PHASE_STOP = Path(__file__).with_name("phase_stop.py")
# A short run that trains every step (constant-reward groups kept) and checkpoints every step; TRAIN_ARGS on
# the arithmetic environment.
RUN_ARGS = [
    f"model_name={TINY}",
    "batch_size=4",
    "group_size=2",
    "max_tokens=4",
    "eval_every=0",
    "eval_problems=2",
    "save_every=1",
    "remove_constant_reward_groups=false",
    "seed=3",
]
TRAIN_ARGS = ["env=arithmetic", *RUN_ARGS]


def train_env(home: Path) -> dict[str, str]:
    """The environment of a `tinkrl train` subprocess: this checkout first on the path, its own $TINKRL_HOME."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "TINKRL_HOME": str(home), "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}


def train(
    home: Path,
    cwd: Path,
    *argv: str,
    prefix: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    base: list[str] = TRAIN_ARGS,
) -> subprocess.CompletedProcess:
    """`tinkrl train base argv` to its end (`prefix`: a command line to run it under; `env`: more environment
    variables)."""
    cmd = [*prefix, sys.executable, "-m", "tinkrl.cli", "train", *base, *argv]
    run_env = {**train_env(home), **(env or {})}
    return subprocess.run(cmd, cwd=cwd, env=run_env, capture_output=True, text=True, timeout=400)


def start_stopping(
    home: Path,
    cwd: Path,
    phase: str,
    nth: int | str,
    *argv: str,
    prefix: tuple[str, ...] = (),
    base: list[str] = TRAIN_ARGS,
) -> tuple[subprocess.Popen, Path]:
    """Start `tinkrl train` that freezes the `nth` time it reaches `phase` ("N+": and every later time);
    returns (process, marker file)."""
    marker = cwd / f"stopped-{phase}-{str(nth).rstrip('+')}-{time.monotonic_ns()}"
    cmd = [*prefix, sys.executable, str(PHASE_STOP), phase, str(nth), str(marker), "--", "train", *base, *argv]
    # through a pipe, copied to a file here: a limit set on the run (RLIMIT_FSIZE) must not stop its own output
    proc = subprocess.Popen(cmd, cwd=cwd, env=train_env(home), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    log_path = cwd / f"{marker.name}.log"

    def copy() -> None:
        with log_path.open("wb") as log:
            for line in proc.stdout:
                log.write(line)
                log.flush()

    proc.copier = threading.Thread(target=copy, daemon=True)  # type: ignore[attr-defined]
    proc.copier.start()  # type: ignore[attr-defined]
    proc.log_path = log_path  # type: ignore[attr-defined]
    return proc, marker


def output(proc: subprocess.Popen) -> str:
    """Everything an ended `start_stopping` run printed."""
    proc.copier.join(30)  # type: ignore[attr-defined]
    return proc.log_path.read_text(errors="replace")  # type: ignore[attr-defined]


def stopped_pid(proc: subprocess.Popen) -> int:
    """The pid of the python that runs tinkrl (the process itself, or its child under a `prefix` command)."""
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    kids = children.read_text().split() if children.exists() else []
    return int(kids[0]) if kids else proc.pid


def wait_stopped(proc: subprocess.Popen, marker: Path, timeout: float = 300) -> int:
    """Wait until the run froze at its phase; returns the frozen pid. Fails with the run's log if it ended first.
    To let it go on: `go_on(pid, marker)`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if marker.exists():
            pid = stopped_pid(proc)
            while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
                time.sleep(0.01)
            return pid
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    proc.kill()
    proc.wait()
    pytest.fail(f"the run never reached its phase ({marker.name}); it ended:\n{output(proc)[-3000:]}")


def go_on(pid: int, marker: Path) -> None:
    """Let a frozen run go on (to its next stop, if it stops again)."""
    marker.unlink()
    os.kill(pid, signal.SIGCONT)


def kill_at(home: Path, cwd: Path, phase: str, nth: int, *argv: str) -> str:
    """Run until the `nth` `phase`, SIGKILL it there; returns its output."""
    proc, marker = start_stopping(home, cwd, phase, nth, *argv)
    pid = wait_stopped(proc, marker)
    os.kill(pid, signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL
    return output(proc)


def jsonl_rows(path: Path) -> list[dict]:
    """Every line of a JSONL file, parsed: a cut-short line fails the test (none may ever be left)."""
    if not path.exists():
        return []
    text = path.read_text()
    assert not text or text.endswith("\n"), f"{path} ends in a cut-short line: {text[-200:]!r}"
    return [json.loads(line) for line in text.splitlines()]


def checkpoint_dir(home: Path, path: str) -> Path:
    """Where `tinker://RUN/...` lies under $TINKRL_HOME `home`."""
    return home / "checkpoints" / path.removeprefix("tinker://")


def assert_consistent(run: Path, home: Path) -> tuple[int, int]:
    """The invariants that hold at every moment of a run's life; returns (steps logged, steps committed)."""
    steps = [m["step"] for m in jsonl_rows(run / "metrics.jsonl")]
    assert steps == list(range(len(steps))), f"metrics.jsonl steps {steps}: a step lost or repeated"
    rows = jsonl_rows(run / "checkpoints.jsonl")
    batches = [r["batch"] for r in rows]
    assert batches == sorted(set(batches)), f"checkpoints.jsonl batches {batches} do not rise strictly"
    for r in rows:
        assert r["batch"] <= len(steps), f"checkpoint of step {r['batch']} recorded before its metrics line"
        state = checkpoint_dir(home, r["state_path"])
        meta = torch.load(state / "optimizer.pt", weights_only=False)["state"]
        assert (state / "tinkrl_meta.json").is_file(), f"{state} recorded but incomplete"
        optimizer_steps = {int(s["step"]) for s in meta.values()}
        assert optimizer_steps == {r["batch"]}, f"{r['name']}: optimizer steps {optimizer_steps}, row {r['batch']}"
    return len(steps), (batches[-1] if batches else 0)
