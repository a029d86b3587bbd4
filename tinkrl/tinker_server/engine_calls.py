"""Bridging engine futures into the server's event loop.

The embedded engine (`tinkrl.local`) answers every call with a future at once, like the
SDK: a `LocalFuture`, which is a `concurrent.futures.Future`. The server must never block its
event loop on one, so it awaits them by callback: a server with a thousand sample requests in
flight must not hold a thousand threads.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
from collections.abc import Callable
from typing import Any

# Threads that run engine calls which might take a lock (creating a client loads a model).
_BLOCKING_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=64, thread_name_prefix="tinker-server-wait")


def blocking_pool() -> concurrent.futures.ThreadPoolExecutor:
    """The shared threads for engine calls that may take a lock."""
    return _BLOCKING_POOL


async def settle(value: Any) -> Any:
    """The result of an engine call: the engine's future (`LocalFuture`, a concurrent future) awaited
    by callback, without a parked thread; a value the call returned at once (a client), itself."""
    if isinstance(value, concurrent.futures.Future):
        return await asyncio.wrap_future(value)
    return value


def settle_blocking(value: Any) -> Any:
    """The same, from a worker thread (the per-model submitter)."""
    return value.result() if isinstance(value, concurrent.futures.Future) else value


def named_kwargs(fn: Callable[..., Any]) -> set[str]:
    """Keyword names `fn` declares. A catch-all `**kwargs` does not count: an option the
    engine would swallow unread must be refused, not silently ignored."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return set()
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
