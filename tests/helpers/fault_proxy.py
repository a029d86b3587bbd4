"""A fault-injecting HTTP proxy for the Tinker protocol: it stands between a run's SDK and `tinkrl serve tinker`
and, at chosen requests, answers as a misbehaving hosted service does.

Faults (`Fault.kind`):
- `429`: Too Many Requests with `Retry-After: 1`, the request never reaching the service;
- `503`: Service Unavailable, the request never reaching the service;
- `500`: the service ran the request, then the answer is replaced by Internal Server Error;
- `reset`: the service ran the request; its answer's headers and half its body go out, then the connection
  is reset (TCP RST);
- `delay`: the service ran the request; its answer is held `delay_s` (past the client's timeout), then sent
  to a client that has usually given up;
- `duplicate`: the request reaches the service twice (as a retrying load balancer may deliver it); the
  client gets the second answer.

A fault picks its request by route (the last part of the path, e.g. `forward_backward`; for
`retrieve_future`, `retrieve_future:<X-Tinker-Request-Type>`, e.g. `retrieve_future:ForwardBackward`) and by
occurrence (the nth request to that route). `seeded_faults` draws those points from a seed.
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from tinkrl.aio_thread import serve_app_in_thread

KINDS = ("429", "503", "500", "reset", "delay", "duplicate")
# The hop-by-hop headers a proxy does not pass on, and those aiohttp sets itself.
_SKIP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding"}


@dataclass(frozen=True)
class Fault:
    """`kind` (one of KINDS) at the `nth` (1-based) request to `route`."""

    route: str
    nth: int
    kind: str
    delay_s: float = 50.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; one of {', '.join(KINDS)}")


@dataclass
class Injected:
    """What the proxy did: every request's route in order, and each fault it injected."""

    routes: list[str] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)


def route_of(request: web.Request) -> str:
    """The route a fault names: the path's last part, with the awaited request's type for `retrieve_future`."""
    name = request.path.rstrip("/").rsplit("/", 1)[-1]
    if request.path.startswith("/api/v1/sessions/"):
        name = "finish" if name == "finish" else "sessions"
    if name == "retrieve_future":
        name += ":" + request.headers.get("X-Tinker-Request-Type", "")
    return name


def seeded_faults(seed: int, kinds: tuple[str, ...], routes: tuple[str, ...], max_nth: int) -> list[Fault]:
    """One fault of each kind in `kinds`, at a route of `routes` and an occurrence up to `max_nth` drawn from
    `seed`: the same seed, the same points; no two faults on one request."""
    rng = random.Random(seed)
    taken: set[tuple[str, int]] = set()
    faults = []
    for kind in kinds:
        while (point := (rng.choice(routes), rng.randint(1, max_nth))) in taken:
            pass
        taken.add(point)
        faults.append(Fault(point[0], point[1], kind))
    return faults


class FaultProxy:
    """An aiohttp app forwarding every request to `upstream`, with `faults` injected on the way."""

    def __init__(self, upstream: str, faults: list[Fault]) -> None:
        self.upstream = upstream.rstrip("/")
        self.faults = {(f.route, f.nth): f for f in faults}
        self.seen: Counter[str] = Counter()
        self.injected = Injected()
        self._lock = threading.Lock()
        self._session: aiohttp.ClientSession | None = None
        self.app = web.Application(client_max_size=1 << 31)
        self.app.router.add_route("*", "/{tail:.*}", self.handle)
        self.app.on_cleanup.append(self._close)

    async def _close(self, _app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    def _fault_for(self, route: str) -> Fault | None:
        with self._lock:
            self.seen[route] += 1
            self.injected.routes.append(route)
            fault = self.faults.get((route, self.seen[route]))
            if fault is not None:
                self.injected.faults.append(fault)
            return fault

    async def _forward(self, request: web.Request, body: bytes) -> tuple[int, dict[str, str], bytes]:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _SKIP_HEADERS}
        url = self.upstream + request.rel_url.path_qs
        async with self._session.request(request.method, url, data=body, headers=headers) as reply:
            out = {k: v for k, v in reply.headers.items() if k.lower() not in _SKIP_HEADERS}
            return reply.status, out, await reply.read()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        fault = self._fault_for(route_of(request))
        kind = fault.kind if fault else None
        if kind == "429":
            return web.json_response({"detail": "rate limited"}, status=429, headers={"Retry-After": "1"})
        if kind == "503":
            return web.json_response({"detail": "service unavailable"}, status=503)
        if kind == "duplicate":
            await self._forward(request, body)
        status, headers, payload = await self._forward(request, body)
        if kind == "500":
            return web.json_response({"detail": "internal server error"}, status=500)
        if kind == "delay":
            await asyncio.sleep(fault.delay_s)  # type: ignore[union-attr]
        if kind == "reset":
            return await self._reset_mid_body(request, status, headers, payload)
        return web.Response(status=status, headers=headers, body=payload)

    @staticmethod
    async def _reset_mid_body(
        request: web.Request, status: int, headers: dict[str, str], payload: bytes
    ) -> web.StreamResponse:
        response = web.StreamResponse(status=status, headers=headers)
        response.content_length = len(payload)
        await response.prepare(request)
        await response.write(payload[: len(payload) // 2])
        transport = request.transport
        if transport is not None:
            sock = transport.get_extra_info("socket")
            if sock is not None:  # linger 0: close sends RST, not FIN
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            transport.abort()
        return response


@contextmanager
def fault_proxy(upstream: str, faults: list[Fault]) -> Iterator[tuple[str, FaultProxy]]:
    """Run a FaultProxy in front of `upstream` on a background thread; yields (its URL, the proxy)."""
    proxy = FaultProxy(upstream, faults)
    with serve_app_in_thread(proxy.app, name="fault-proxy") as url:
        yield url, proxy
