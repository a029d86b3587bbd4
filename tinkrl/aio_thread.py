"""Serving an aiohttp app from a background thread (tests, notebooks, the trainer's proxy), and the
thread pool a run's event loop lends to blocking calls.

`tinkrl serve tinker` and `tinkrl serve openai` run their apps this way when embedded in
another program: the app gets its own event loop on a daemon thread, the caller gets the
base URL, and leaving the block shuts the server down. `UNREADABLE_BODY` names the errors aiohttp
raises when a request's body cannot be read as sent, which every server answers as the client's
mistake (400).

`widen_default_executor` gives a run's loop enough threads for its episodes: episodes call their
sandboxes through `asyncio.to_thread`, and a provider with a concurrency cap (harbor, kubernetes)
holds the calling thread in `create` until a slot frees, while the episodes that hold the slots
need threads of the same pool to finish. With asyncio's default pool (CPU count + 4 threads) a
few waiting starts would stall the whole run.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

# A body aiohttp cannot read as sent: a Content-Encoding (zstd, gzip, deflate) that does not decode, a body cut short.
UNREADABLE_BODY = (HttpProcessingError, RequestPayloadError)
RUN_THREADS = 512  # threads are made only as calls need them; waiting ones cost no CPU


def widen_default_executor(threads: int = RUN_THREADS) -> None:
    """Give the running loop a default executor of up to `threads` threads (see the module docstring);
    `asyncio.run` shuts it down with the loop."""
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tinkrl-run")
    asyncio.get_running_loop().set_default_executor(pool)


@contextmanager
def serve_app_in_thread(
    app: web.Application, host: str = "127.0.0.1", port: int = 0, *, name: str = "aiohttp-server", backlog: int = 1024
) -> Iterator[str]:
    """Yield `http://host:port` (port 0 picks a free one); bind errors are raised to the caller."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: dict[str, Any] = {}

    async def start() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port, backlog=backlog)
        await site.start()
        holder["runner"] = runner
        holder["port"] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(start())
        except BaseException as e:  # surface bind errors to the caller
            holder["error"] = e
            ready.set()
            return
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    ready.wait()
    if "error" in holder:
        raise holder["error"]
    try:
        yield f"http://{host}:{holder['port']}"
    finally:
        asyncio.run_coroutine_threadsafe(holder["runner"].cleanup(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
