"""The future every embedded-engine call returns: a thread future that asyncio code can await.

The engine thread completes it; callers block with `.result()` or `await` it, as they do the
SDK's `APIFuture`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures


class LocalFuture(concurrent.futures.Future):
    """A concurrent future that is also awaitable, like the SDK's APIFuture."""

    def __await__(self):
        return asyncio.wrap_future(self).__await__()

    async def result_async(self, timeout: float | None = None):
        """The result, awaited with an optional timeout (the SDK's spelling)."""
        return await asyncio.wait_for(asyncio.wrap_future(self), timeout)

    def future(self) -> concurrent.futures.Future:
        """The underlying concurrent future (this object itself)."""
        return self
