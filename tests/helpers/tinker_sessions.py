"""How Tinker SDK sessions ended: as `tinkrl serve tinker` recorded them, and as the SDK still runs them here."""

from __future__ import annotations

import asyncio
import time

from tinkrl.tinker_server.app import TinkerServer


def finish_reasons(server: TinkerServer) -> list[str | None]:
    """The finish reason the server recorded for each session, in the order they were opened (None: open)."""
    return [session.finished for session in server.registry.sessions.values()]


def sdk_heartbeats() -> set[str]:
    """The ids of the sessions whose heartbeat loop the SDK still runs in this process. The SDK (pinned
    in constraints.txt) runs them as tasks on its private event loop; a session that was finished, or
    whose finish was given up, has none."""
    from tinker.lib.internal_client_holder import _internal_client_holder_thread_singleton as sdk_thread

    loop = sdk_thread.loop_if_started()
    if loop is None:
        return set()

    async def heartbeats() -> set[str]:
        coros = [task.get_coro() for task in asyncio.all_tasks()]
        return {
            c.cr_frame.f_locals["session_id"]
            for c in coros
            if getattr(c, "__name__", "") == "_session_heartbeat" and c.cr_frame is not None
        }

    return asyncio.run_coroutine_threadsafe(heartbeats(), loop).result(timeout=10)


def wait_until_no_heartbeat(session_ids: set[str], timeout_s: float = 5.0) -> set[str]:
    """Poll until none of `session_ids` has a heartbeat loop (the SDK stops them on its own thread);
    the ones that still have one after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while (alive := sdk_heartbeats() & session_ids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive
