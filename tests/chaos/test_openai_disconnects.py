"""The OpenAI-compatible server under 256 concurrent requests, a third of whose clients go away mid-request.

`tinkrl serve openai`'s server (`ProxyServer`) over the embedded engine, on the tiny model. Each
round sends 256 requests at once, chat and completions, plain and streamed; with a fixed seed a
third of the clients disconnect: before the response (after a random delay), after the first
bytes of a stream, or halfway through sending the request body. What must hold: every request
whose client stays gets a complete, valid answer; after each round the server has no request
in flight (`/health`'s `in_flight`) and the engine no sampling work queued, so nothing a gone
client started is left holding a slot; and memory stays flat from round to round: the Python
objects alive after a collection (within 256, one per request of a round) and the process's
resident memory (within 64 MiB), from the first rounds, which fill caches, to the last.

What grew here once was oneDNN's kernel caches: every prefill of a new token count compiled and kept
new kernels (for as long as the caches had room); the engine now hands oneDNN
36 row counts at most (`tinkrl.local.transformer.padded_rows`, tested in tests/test_engine.py), so
the kernels it keeps stop growing once the counts a workload meets have been seen.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import json
import random
import re
import time
from pathlib import Path
from urllib.parse import urlparse

import aiohttp
import pytest

from tinkrl.local import ServiceClient
from tinkrl.local.models import TINY_MODEL
from tinkrl.proxy.server import ProxyServer, serve_in_thread

SEED = 29
CONCURRENT = 256
KINDS = ["chat", "chat_stream", "completion", "cut_waiting", "cut_stream", "cut_body"]
WEIGHTS = [3, 2, 1, 1, 1, 1]  # a third of the clients go away


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def allocate_large_blocks_apart() -> None:
    """Have glibc give every block of 128 KiB or more its own mapping, returned on free. Otherwise its
    threshold for that rises with the first large block freed, later tensors come from the heap, and
    the heap's fragments stay resident in steps of tens of MiB that say nothing of what is alive."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, 128 * 1024)
    except (OSError, AttributeError):
        pass


def rss_mib() -> float:
    """Resident memory in MiB, after returning the allocator's free pages to the system (glibc keeps them
    otherwise, and its arenas' ups and downs would hide or fake a trend)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    return int(re.search(r"VmRSS:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) / 1024


def body_of(kind: str, i: int) -> tuple[str, dict]:
    if kind == "completion":
        return "/v1/completions", {"model": TINY_MODEL, "prompt": f"Once upon a time {i}", "max_tokens": 8, "seed": i}
    stream = kind in ("chat_stream", "cut_stream")
    messages = [{"role": "user", "content": f"request {i}: say something"}]
    return "/v1/chat/completions", {
        "model": TINY_MODEL,
        "messages": messages,
        "max_tokens": 8,
        "seed": i,
        "stream": stream,
    }


async def one(session: aiohttp.ClientSession, url: str, kind: str, i: int, rng: random.Random) -> str | None:
    """Send request `i` of `kind`; returns a problem (None when it went as it must)."""
    path, body = body_of(kind, i)
    if kind == "cut_body":  # headers and half the body, then the connection is closed
        u = urlparse(url)
        reader, writer = await asyncio.open_connection(u.hostname, u.port)
        raw = json.dumps(body).encode()
        head = f"POST {path} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
        writer.write(f"{head}Content-Length: {len(raw)}\r\n\r\n".encode() + raw[: len(raw) // 2])
        await writer.drain()
        await asyncio.sleep(rng.uniform(0, 0.2))
        writer.close()
        return None
    if kind == "cut_waiting":  # the whole request, then gone before the answer
        try:
            await asyncio.wait_for(session.post(url + path, json=body), timeout=rng.uniform(0.001, 0.3))
        except TimeoutError:
            pass
        return None
    async with session.post(url + path, json=body) as resp:
        if resp.status != 200:
            return f"{kind} {i}: HTTP {resp.status}: {await resp.text()}"
        if kind == "cut_stream":  # read the headers' worth, then drop the connection
            await resp.content.read(1)
            resp.close()
            return None
        if kind == "chat_stream":
            text = await resp.text()
            return None if text.rstrip().endswith("data: [DONE]") else f"{kind} {i}: stream ended early: {text[-200:]}"
        reply = await resp.json()
        choice = reply["choices"][0]
        content = choice["text"] if kind == "completion" else choice["message"]["content"]
        return None if isinstance(content, str) and choice["finish_reason"] in ("stop", "length") else f"{reply}"


async def round_of(url: str, rng: random.Random) -> list[str]:
    kinds = rng.choices(KINDS, WEIGHTS, k=CONCURRENT)
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
        results = await asyncio.gather(*(one(session, url, k, i, rng) for i, k in enumerate(kinds)))
    return [r for r in results if r is not None]


def wait_idle(url: str, server: ProxyServer, engine) -> None:
    """Until nothing is in flight: the server's handlers done, the engine's sampling queue empty."""
    import urllib.request

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with urllib.request.urlopen(url + "/health", timeout=10) as r:
            in_flight = json.loads(r.read())["in_flight"]
        if in_flight == 0 and not engine._samples:
            return
        time.sleep(0.05)
    raise AssertionError(f"still in flight after the round: server {in_flight}, engine queue {len(engine._samples)}")


def drive(rounds: int) -> None:
    allocate_large_blocks_apart()
    service = ServiceClient()
    policy = service.create_sampling_client(base_model=TINY_MODEL)
    server = ProxyServer(policy, model_name=TINY_MODEL)
    rng = random.Random(SEED)
    objects, rss = [], []
    with serve_in_thread(server) as url:
        for r in range(rounds):
            problems = asyncio.run(round_of(url, rng))
            assert not problems, f"round {r}: {len(problems)} requests went wrong, e.g. {problems[:3]}"
            wait_idle(url, server, policy.engine)
            # the prefix cache keeps recent rows' keys/values by design, within its bounds
            # (tests/test_prefix_cache.py): what is left after clearing it must not grow
            policy.engine.submit(policy.engine.prefix_cache.clear).result()
            gc.collect()
            objects.append(len(gc.get_objects()))
            rss.append(rss_mib())
    print(f"objects per round: {objects}\nRSS MiB per round: {[round(x) for x in rss]}")
    # the first rounds fill caches (the tokenizer's, the engine's kernels for each new batch shape, connections)
    settled = 1 if rounds < 5 else 4
    growth = objects[-1] - objects[settled]
    assert growth < CONCURRENT, f"{growth} more live objects after {rounds - 1 - settled} rounds: {objects}"
    assert rss[-1] - rss[settled] < 64, f"resident memory grew {rss[-1] - rss[settled]:.0f} MiB: {rss}"


def test_256_concurrent_with_disconnects_3_rounds():
    drive(3)


@pytest.mark.slow  # ~1.5 min
def test_256_concurrent_with_disconnects_24_rounds_memory_flat():
    drive(24)
