"""The ORS client side: how to reach a remote environment, and one episode's session on it.

What is unusual:
- A dead server, a lost session, a tool that raised on the server, or a transport error is
  `InfraFailure` (`failure_mode` says which): recorded, left out of the group. The SDK
  retries 429/502/503/504 and connection errors; opening a session is retried on top of
  that (`ORSSession.retries`).
- Sessions are always closed: `ORSSession.close()` (exactly once, also on errors and
  cancellation), and at interpreter exit a synchronous `/delete` for any session still
  registered (Ctrl-C).
- The SDK's aiohttp clients belong to one event loop, so each episode makes and closes its own.
- The OpenReward API key is sent only to OpenReward's hosted service, never to a
  self-hosted `base_url`.
"""

from __future__ import annotations

import asyncio
import atexit
import random
import threading
import urllib.request
from typing import Any
from urllib.parse import urlparse

from tinkrl.errors import InfraFailure

HOSTED_URL = "https://openreward.ai"
_OPEN_TIMEOUT_S = 120.0
_CLOSE_TIMEOUT_S = 15.0


def _is_hosted(base_url: str | None) -> bool:
    if base_url is None:
        return True
    host = urlparse(base_url).hostname or ""
    return host == "openreward.ai" or host.endswith(".openreward.ai")


class ORSClient:
    """How to reach one remote environment: server, environment name/variant, credentials."""

    def __init__(
        self, name: str, base_url: str | None, variant: str | None, api_key: str | None, server_key: str | None = None
    ):
        self.name, self.base_url, self.variant = name, base_url, variant
        # Never hand the OpenReward key to a server the user points us at; that server gets the key the
        # user gave for it (`env.server_key_env`), if any.
        self.api_key = api_key if _is_hosted(base_url) else (server_key or ("" if "/" in name else None))

    @property
    def where(self) -> str:
        return self.base_url or HOSTED_URL

    def connect(self) -> tuple[Any, Any]:
        """(SDK environments API, environment handle) bound to the running loop; `await api.aclose()` after.

        The SDK's aiohttp clients belong to the loop they were made in, so every user (an
        episode, a survey at build time) makes its own and closes it: nothing leaks when the
        trainer's loops come and go.
        """
        if self.base_url is None:
            from openreward import AsyncOpenReward

            api = AsyncOpenReward(api_key=self.api_key or "").environments
        else:
            from openreward.api.environments.client import AsyncEnvironmentsAPI

            api = AsyncEnvironmentsAPI(base_url=self.base_url, api_key=self.api_key)  # type: ignore[arg-type]
        return api, api.get(self.name, variant=self.variant, base_url=self.base_url)


def _failure(e: BaseException, what: str) -> InfraFailure:
    """Map an SDK/transport exception to a recorded infrastructure failure."""
    from openreward.api.errors import SessionTerminatedError, ToolFailed, TransportError

    if isinstance(e, InfraFailure):
        return e
    if isinstance(e, ToolFailed):
        mode = "env_tool_raised"
    elif isinstance(e, SessionTerminatedError):
        mode = "env_session_lost"
    elif isinstance(e, (asyncio.TimeoutError, TimeoutError)):
        mode = "env_timeout"
    elif isinstance(e, TransportError) or isinstance(e, (ConnectionError, OSError)):
        mode = "env_unreachable"
    else:
        import aiohttp

        if isinstance(e, aiohttp.ClientResponseError):
            mode = "env_http_error"
        elif isinstance(e, aiohttp.ClientError):
            mode = "env_unreachable"
        else:
            mode = "env_server_error"
    detail = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
    return InfraFailure(f"{what}: {type(e).__name__}: {detail}", failure_mode=mode)


# Sessions opened and not yet closed: sid -> (server url, deployment header, api key).
# At exit, any left (an interrupted run) get a synchronous /delete so servers free them.
_OPEN_SESSIONS: dict[str, tuple[str, str, str | None]] = {}
_OPEN_LOCK = threading.Lock()


def _delete_leftover_sessions() -> None:
    with _OPEN_LOCK:
        left = list(_OPEN_SESSIONS.items())
        _OPEN_SESSIONS.clear()
    for sid, (url, deployment, key) in left:
        for path in ("/delete", "/delete_session"):
            headers = {"X-Session-ID": sid, "X-Deployment": deployment, "Content-Type": "application/json"}
            if key is not None:
                headers["X-API-Key"] = key
            try:
                req = urllib.request.Request(url.rstrip("/") + path, data=b"{}", headers=headers, method="POST")
                urllib.request.urlopen(req, timeout=2).close()
            except Exception:
                pass


atexit.register(_delete_leftover_sessions)


def open_session_count() -> int:
    """Sessions this process opened and has not closed yet (for tests and shutdown checks)."""
    with _OPEN_LOCK:
        return len(_OPEN_SESSIONS)


class ORSSession:
    """One episode's session: opened with retries, closed exactly once whatever happens."""

    def __init__(
        self, client: ORSClient, split: str, index: int, secrets: dict[str, str], retries: int, timeout_s: float
    ):
        self.client, self.split, self.index = client, split, index
        self.secrets, self.retries, self.timeout_s = secrets, retries, timeout_s
        self._session: Any = None
        self._api: Any = None
        self._closed = False

    async def open(self) -> Any:
        last: BaseException | None = None
        self._api, env = self.client.connect()
        for attempt in range(self.retries + 1):
            session = env.session(split=self.split, index=self.index, secrets=self.secrets or None)
            try:
                await asyncio.wait_for(session.__aenter__(), timeout=min(self.timeout_s, _OPEN_TIMEOUT_S))
            except Exception as e:  # the half-made session (sid but no env) is released before retrying
                last = e
                await self._exit(session)
                if not _retryable_open_error(e) or attempt == self.retries:
                    break
                await asyncio.sleep(min(8.0, 0.5 * 2**attempt) * (0.5 + random.random()))
                continue
            self._session = session
            with _OPEN_LOCK:
                _OPEN_SESSIONS[session.sid] = (str(session.base_url), session.deployment or "", session.api_key)
            return session
        assert last is not None
        raise _failure(last, f"opening a session on {self.client.where} ({self.split}[{self.index}])")

    async def call(self, coro_fn, what: str):
        """Run one session request with the per-request time limit; transport problems -> InfraFailure."""
        from openreward.api.errors import ToolCallError

        try:
            return await asyncio.wait_for(coro_fn(self._session), timeout=self.timeout_s)
        except ToolCallError:
            raise
        except Exception as e:
            raise _failure(e, what) from None

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        session, self._session = self._session, None
        api, self._api = self._api, None
        try:
            if session is not None and await self._exit(session):
                with _OPEN_LOCK:  # else left for the synchronous delete at exit
                    _OPEN_SESSIONS.pop(session.sid, None)
        finally:
            if api is not None:
                await _shielded(api.aclose())

    @staticmethod
    async def _exit(session: Any) -> bool:
        return await _shielded(session.__aexit__(None, None, None))


async def _shielded(coro) -> bool:
    """Run cleanup to completion (bounded) even if the caller is being cancelled (Ctrl-C, timeout).

    True when it completed. A cancellation that arrives meanwhile is absorbed: this is the
    last thing an episode does.
    """
    task = asyncio.ensure_future(coro)
    try:
        await asyncio.wait_for(asyncio.shield(task), timeout=_CLOSE_TIMEOUT_S)
        return True
    except (asyncio.CancelledError, Exception):
        return False


def _retryable_open_error(e: BaseException) -> bool:
    import aiohttp

    if isinstance(e, aiohttp.ClientResponseError):
        return e.status == 429 or e.status >= 500
    return True  # transport errors, timeouts, SDK retry exhaustion
