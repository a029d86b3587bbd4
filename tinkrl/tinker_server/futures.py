"""The server's promise table: every long operation answers with a request id at once, and
`/api/v1/retrieve_future` long-polls that id until the result is ready.

A result is kept after it has been fetched (a client whose connection dropped mid-response
fetches again) and dropped a while later, so a server that runs for days does not grow.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from dataclasses import dataclass, field
from typing import Literal

PayloadKind = Literal["proto", "json", "error"]

# How long a fetched result stays (for re-fetches), and how long an unfetched one waits.
KEEP_AFTER_FETCH_S = 120.0
KEEP_UNFETCHED_S = 6 * 3600.0


@dataclass
class Promise:
    """One request's result, pending or done (protobuf, JSON or an error), with when it finished and was fetched."""

    request_id: str
    kind_of_request: str
    created: float = field(default_factory=time.monotonic)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    payload_kind: PayloadKind | None = None
    payload: bytes | dict | None = None
    finished_at: float | None = None
    fetched_at: float | None = None

    def resolve(self, kind: PayloadKind, payload: bytes | dict) -> None:
        if self.done.is_set():
            return
        self.payload_kind, self.payload = kind, payload
        self.finished_at = time.monotonic()
        self.done.set()

    def fail(self, message: str, category: Literal["user", "server", "unknown"]) -> None:
        self.resolve("error", {"error": message, "category": category})


class PromiseTable:
    """request id -> Promise, on one event loop.

    Request ids carry a prefix of their own table (one per server process): a client that polls an id
    of a server that was restarted meanwhile gets "unknown" (410), never another request's result."""

    def __init__(self) -> None:
        self._promises: dict[str, Promise] = {}
        self._prefix = f"req-{secrets.token_hex(4)}"
        self._ids = itertools.count(1)
        self._last_sweep = time.monotonic()

    def create(self, kind_of_request: str) -> Promise:
        if time.monotonic() - self._last_sweep > 5.0:
            self.sweep()
        promise = Promise(request_id=f"{self._prefix}-{next(self._ids)}", kind_of_request=kind_of_request)
        self._promises[promise.request_id] = promise
        return promise

    def get(self, request_id: str) -> Promise | None:
        return self._promises.get(request_id)

    async def wait(self, promise: Promise, timeout_s: float) -> bool:
        """True once resolved; False when `timeout_s` passed first (the client polls again)."""
        try:
            await asyncio.wait_for(promise.done.wait(), timeout_s)
        except TimeoutError:
            return False
        promise.fetched_at = time.monotonic()
        return True

    def sweep(self) -> None:
        now = self._last_sweep = time.monotonic()
        stale = [
            rid
            for rid, p in self._promises.items()
            if p.finished_at is not None
            and (
                (p.fetched_at is not None and now - p.fetched_at > KEEP_AFTER_FETCH_S)
                or now - p.finished_at > KEEP_UNFETCHED_S
            )
        ]
        for rid in stale:
            del self._promises[rid]
