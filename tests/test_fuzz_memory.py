"""The servers' memory over a long round of generated requests: `tinkrl serve tinker` and `tinkrl serve openai`
as their own processes, driven as tests/test_fuzz_servers.py drives them in-process, their resident memory
read every few hundred requests. What must hold: once warm, it stays flat (a refused request leaves
nothing behind: no session, promise, sampler or buffer).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import schemathesis
from helpers.engine import real_models_dir
from helpers.fuzz import LONG
from helpers.ors import free_port
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fuzz_servers import KEY, TIMEOUT_S, Target, drive, operations

from tinkrl.local.models import TINY_MODEL

REQUESTS = 3000
EVERY = 250
# Resident memory may rise by this much from the third reading (the server warm) to the last.
BOUND_MIB = 24


def resident_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def start(tmp_path: Path, *serve: str, health: str) -> tuple[subprocess.Popen, str]:
    """`tinkrl serve ...` as its own process on a free port, with its own $TINKRL_HOME; (process, URL)."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    if not (home / "models").exists():
        (home / "models").symlink_to(real_models_dir(), target_is_directory=True)
    port = free_port()
    env = {**os.environ, "TINKRL_HOME": str(home), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    log = open(tmp_path / f"serve-{port}.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "tinkrl.cli", "serve", *serve, "--port", str(port), "--api-key", KEY],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + health, headers={"Authorization": f"Bearer {KEY}"}, timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.3)
    proc.kill()
    raise AssertionError(
        f"tinkrl serve {serve[0]} did not come up: {(tmp_path / f'serve-{port}.log').read_text()[-2000:]}"
    )


class NoErrors:
    """The in-process error log's stand-in: a server in its own process logs to its own file."""

    def take(self) -> list[str]:
        return []


def fuzz_and_read_memory(target: Target, pid: int) -> list[float]:
    """REQUESTS generated requests to `target`; its resident memory (MiB) every EVERY of them."""
    readings: list[float] = []
    sent = [0]

    @settings(LONG, max_examples=REQUESTS)
    @given(st.data())
    def one(data) -> None:
        drive(target, NoErrors(), data)  # type: ignore[arg-type]
        sent[0] += 1
        if sent[0] % EVERY == 0:
            readings.append(resident_mib(pid))

    one()
    return readings


def assert_flat(readings: list[float], log: Path) -> None:
    assert len(readings) >= 6, readings
    rise = max(readings[2:]) - readings[2]
    assert rise < BOUND_MIB, f"resident MiB every {EVERY} requests: {[round(r) for r in readings]}"
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]


@pytest.mark.slow  # ~40 s
def test_serve_tinker_memory_flat_over_a_long_round(tmp_path):
    proc, url = start(tmp_path, "tinker", "--model", TINY_MODEL, "--log-level", "WARNING", health="/api/v1/healthz")
    try:
        doc = httpx.get(url + "/api/v1/openapi.json", headers={"X-API-Key": KEY}, timeout=TIMEOUT_S).json()
        schema = schemathesis.openapi.from_dict(doc).exclude(path="/api/v1/forward_backward")
        readings = fuzz_and_read_memory(Target("serve tinker", operations(schema), url, {"X-API-Key": KEY}), proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)
    print(f"serve tinker resident MiB every {EVERY} requests: {[round(r) for r in readings]}")
    assert_flat(readings, next(tmp_path.glob("serve-*.log")))


@pytest.mark.slow  # ~40 s
def test_serve_openai_memory_flat_over_a_long_round(tmp_path):
    proc, url = start(tmp_path, "openai", "--model", TINY_MODEL, health="/health")
    try:
        headers = {"Authorization": f"Bearer {KEY}"}
        doc = httpx.get(url + "/openapi.json", headers=headers, timeout=TIMEOUT_S).json()
        target = Target("serve openai", operations(schemathesis.openapi.from_dict(doc)), url, headers)
        readings = fuzz_and_read_memory(target, proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)
    print(f"serve openai resident MiB every {EVERY} requests: {[round(r) for r in readings]}")
    assert_flat(readings, next(tmp_path.glob("serve-*.log")))
