"""Servers killed and restarted under a running training.

- The Tinker server (`tinkrl serve tinker`) is frozen inside a `forward_backward` of a client's run
  (`tinkrl train backend=tinker`), SIGKILLed there and started again on the same port. The
  training state of the killed server is gone with it. What must hold: the client's SDK
  reconnects to the new server, which answers that the request it waits for is unknown there
  (never another request's result: request ids differ between server processes); the run
  stops with a one-line error; run again, it resumes from its last checkpoint on the new
  server and finishes with every step once and exactly `max_steps` optimizer steps in its
  final checkpoint (no optim_step lost or applied twice).
- The ORS env server (`tinkrl serve env`) is SIGKILLed between two steps of a run that trains on
  it and a local environment, and started again one step later. What must hold: the step that
  ran while it was down records every remote episode as a failure (never a reward), the local
  environment trains every step, and once the server is back the remote episodes run again.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from helpers.chaos import (
    PHASE_STOP,
    RUN_ARGS,
    TRAIN_ARGS,
    go_on,
    jsonl_rows,
    output,
    start_stopping,
    train,
    train_env,
    wait_stopped,
)
from helpers.engine import TINY
from helpers.ors import free_port, start_server, stop

from tinkrl.tinker_server.futures import PromiseTable

SEED = 23


def start_tinker_server(home: Path, port: int, stop_at: tuple[str, int] | None = None) -> subprocess.Popen:
    """`tinkrl serve tinker` on 127.0.0.1:port (frozen at `stop_at`'s phase and occurrence, if given)."""
    serve = ["serve", "tinker", "--port", str(port), "--model", TINY, "--log-level", "WARNING"]
    if stop_at is None:
        cmd = [sys.executable, "-m", "tinkrl.cli", *serve]
    else:
        cmd = [sys.executable, str(PHASE_STOP), stop_at[0], str(stop_at[1]), str(home / "server-stopped"), "--", *serve]
    log = open(home / f"server-{port}-{len(list(home.glob('server-*.log')))}.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(cmd, env=train_env(home), stdout=log, stderr=subprocess.STDOUT)
    log.close()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(url + "/api/v1/healthz", timeout=2):
                return proc
        except OSError:
            time.sleep(0.3)
    proc.kill()
    raise AssertionError(f"tinkrl serve tinker did not come up on {url}")


def test_request_ids_differ_between_server_processes():
    """A client polling a request id of a killed server must never get another request's result."""
    assert PromiseTable().create("x").request_id != PromiseTable().create("x").request_id


@pytest.mark.slow  # ~30 s: two server starts and two runs
def test_tinker_server_killed_mid_step_and_restarted(home, tmp_path):
    port = free_port()
    nth = random.Random(SEED).randint(2, 3)  # the forward_backward of step 1 or 2: a checkpoint exists
    server = start_tinker_server(home, port, stop_at=("train", nth))
    url = f"http://127.0.0.1:{port}"
    run, steps = tmp_path / "run", 4
    argv = ["backend=tinker", f"base_url={url}", f"max_steps={steps}", f"log_path={run}"]
    client_env = {"TINKER_API_KEY": "tml-local", "TINKER_TELEMETRY": "0"}
    try:
        client = subprocess.Popen(
            [sys.executable, "-m", "tinkrl.cli", "train", *TRAIN_ARGS, *argv],
            cwd=tmp_path,
            env={**train_env(home), **client_env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        marker = home / "server-stopped"
        pid = wait_stopped(server, marker)
        os.kill(pid, signal.SIGKILL)
        server.wait(30)
        server = start_tinker_server(home, port)
        out = client.communicate(timeout=300)[0]
        assert client.returncode == 1, out[-3000:]
        last = out.strip().splitlines()[-1]
        assert last.startswith("tinkrl train: the Tinker service lost this run's state"), out[-3000:]
        assert "run the same command again" in last
        assert "Traceback" not in out, out[-3000:]
        logged = [m["step"] for m in jsonl_rows(run / "metrics.jsonl")]
        committed = [r["batch"] for r in jsonl_rows(run / "checkpoints.jsonl")]
        assert logged == list(range(nth - 1)) and committed == list(range(1, nth)), (logged, committed)

        again = train(home, tmp_path, *argv, env=client_env)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        assert f"(step {nth - 1})" in again.stdout
    finally:
        stop(server)
    assert [m["step"] for m in jsonl_rows(run / "metrics.jsonl")] == list(range(steps))
    rows = jsonl_rows(run / "checkpoints.jsonl")
    assert [r["batch"] for r in rows] == list(range(1, steps + 1))
    final = home / "checkpoints" / rows[-1]["state_path"].removeprefix("tinker://")
    assert json.loads((final / "tinkrl_meta.json").read_text())["step"] == steps  # every optim_step once


@pytest.mark.slow  # ~30 s
def test_env_server_killed_between_steps_and_restarted(home, tmp_path):
    port = free_port()
    serve = ["-m", "tinkrl.cli", "serve", "env", "--port", str(port), "--train-size", "20", "arithmetic"]
    server, url = start_server(serve, port)
    down_at = random.Random(SEED).randint(1, 2)  # the step that runs while the server is down
    run, steps = tmp_path / "run", down_at + 2
    config = tmp_path / "config.yaml"
    env = {"max_turns": 1, "session_retries": 0, "call_timeout_s": 5}
    remote = {"base_url": url, "name": "arithmetic", "num_rollouts": 2, "max_failing_rollouts": 0, "env": env}
    config.write_text(yaml.safe_dump({"environments": {"remote": remote, "arithmetic": {"num_rollouts": 2}}}))
    argv = [str(config), f"max_steps={steps}", f"log_path={run}", "batch_size=8"]
    proc, marker = start_stopping(home, tmp_path, "log", "1+", *argv, base=RUN_ARGS)
    try:
        for stop_number in range(1, steps + 1):  # the stop before step N-1's metrics line
            pid = wait_stopped(proc, marker)
            if stop_number == down_at:
                stop(server)
            elif stop_number == down_at + 1:
                server, _ = start_server(serve, port)
            go_on(pid, marker)
        assert proc.wait(120) == 0, output(proc)[-3000:]
    finally:
        stop(server)
    lines = jsonl_rows(run / "metrics.jsonl")
    assert [m["step"] for m in lines] == list(range(steps))
    for m in lines:
        assert m["env/arithmetic/total_episodes"] == 4  # the local environment trained every step
        if m["step"] == down_at:
            assert m["env/remote/failures"] == 4 and m["env/remote/total_episodes"] == 0
        else:
            assert m["env/remote/failures"] == 0 and m["env/remote/total_episodes"] == 4
    failed = [r for r in jsonl_rows(run / "episodes" / f"step_{down_at:06d}.jsonl") if r.get("failure_mode")]
    assert len(failed) == 4 and {r["failure_mode"] for r in failed} == {"env_unreachable"}
    assert all(r["reward"] is None for r in failed)
