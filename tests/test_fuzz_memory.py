"""The servers' memory over a long round of generated requests: `tinkrl serve tinker` and `tinkrl serve openai`
as their own processes, driven as tests/test_fuzz_servers.py drives them in-process, their resident memory
read every few hundred requests. What must hold: once warm, it stays flat (a refused request leaves
nothing behind: no session, promise, sampler or buffer).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest
import schemathesis
from helpers.fuzz import LONG
from helpers.ors import free_port, start_server, stop
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fuzz_servers import KEY, TIMEOUT_S, ErrorLog, Target, drive, operations

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


def start(*serve: str, health: str) -> tuple[subprocess.Popen, str]:
    """`tinkrl serve ...` as its own process on a free port, keyed; (process, URL)."""
    port = free_port()
    return start_server(["-m", "tinkrl.cli", "serve", *serve, "--port", str(port), "--api-key", KEY], port, health)


def fuzz_and_read_memory(target: Target, pid: int) -> list[float]:
    """REQUESTS generated requests to `target`; its resident memory (MiB) every EVERY of them."""
    readings: list[float] = []
    sent = [0]

    @settings(LONG, max_examples=REQUESTS)
    @given(st.data())
    def one(data) -> None:
        drive(target, ErrorLog(), data)  # never installed: the server logs to its own file, read after
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
def test_serve_tinker_memory_flat_over_a_long_round(isolated_home):
    proc, url = start("tinker", "--model", TINY_MODEL, "--log-level", "WARNING", health="/api/v1/healthz")
    try:
        doc = httpx.get(url + "/api/v1/openapi.json", headers={"X-API-Key": KEY}, timeout=TIMEOUT_S).json()
        schema = schemathesis.openapi.from_dict(doc).exclude(path="/api/v1/forward_backward")
        readings = fuzz_and_read_memory(Target("serve tinker", operations(schema), url, {"X-API-Key": KEY}), proc.pid)
    finally:
        stop(proc)
    print(f"serve tinker resident MiB every {EVERY} requests: {[round(r) for r in readings]}")
    assert_flat(readings, Path(proc.log_path))


@pytest.mark.slow  # ~40 s
def test_serve_openai_memory_flat_over_a_long_round(isolated_home):
    proc, url = start("openai", "--model", TINY_MODEL, health="/health")
    try:
        headers = {"Authorization": f"Bearer {KEY}"}
        doc = httpx.get(url + "/openapi.json", headers=headers, timeout=TIMEOUT_S).json()
        target = Target("serve openai", operations(schemathesis.openapi.from_dict(doc)), url, headers)
        readings = fuzz_and_read_memory(target, proc.pid)
    finally:
        stop(proc)
    print(f"serve openai resident MiB every {EVERY} requests: {[round(r) for r in readings]}")
    assert_flat(readings, Path(proc.log_path))
