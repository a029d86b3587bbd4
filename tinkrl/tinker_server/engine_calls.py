"""Bridging engine futures into the server's event loop.

The embedded engine (`tinkrl.local`) answers every call with a future at once, like the
SDK. The server must never block its event loop on one, so this module turns whatever the
engine hands back into something awaitable, preferring callbacks over parked threads:
a server with a thousand sample requests in flight must not hold a thousand threads.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
from collections.abc import Callable
from typing import Any

# Threads that park on `.result()` when a future offers nothing better, and that run
# engine calls which might take a lock. Daemon-style pool sized for many waiters.
_BLOCKING_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=64, thread_name_prefix="tinker-server-wait")


def blocking_pool() -> concurrent.futures.ThreadPoolExecutor:
    """The shared threads for waits that must block and for engine calls that may take a lock."""
    return _BLOCKING_POOL


async def settle(value: Any) -> Any:
    """The result of an engine future (or `value` itself when it is already a result)."""
    if isinstance(value, concurrent.futures.Future):
        return await asyncio.wrap_future(value)
    if isinstance(value, asyncio.Future) and value.get_loop() is asyncio.get_running_loop():
        return await value
    as_concurrent = getattr(value, "future", None)
    if callable(as_concurrent):
        inner = as_concurrent()
        if isinstance(inner, concurrent.futures.Future):
            return await asyncio.wrap_future(inner)
    result = getattr(value, "result", None)
    if callable(result):
        return await asyncio.get_running_loop().run_in_executor(_BLOCKING_POOL, result)
    if inspect.isawaitable(value):
        return await value
    return value


def settle_blocking(value: Any) -> Any:
    """The same, from a worker thread (the per-model submitter)."""
    if isinstance(value, concurrent.futures.Future):
        return value.result()
    result = getattr(value, "result", None)
    if callable(result):
        return result()
    return value


def named_kwargs(fn: Callable[..., Any]) -> set[str]:
    """Keyword names `fn` declares. A catch-all `**kwargs` does not count: an option the
    engine would swallow unread must be refused, not silently ignored."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return set()
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
