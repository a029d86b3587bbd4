"""Per-model ordering of the Tinker server: requests reach the engine in seq_id order, once."""

from __future__ import annotations

import asyncio

from tinkrl.tinker_server.futures import PromiseTable
from tinkrl.tinker_server.sessions import Registry


def test_requests_run_in_seq_order_and_a_resent_request_runs_once():
    async def scenario() -> tuple[list[int], bool, dict]:
        registry = Registry(engine=None, promises=PromiseTable())
        session = registry.create_session("0.38.0", [])
        model = registry.new_model(session.session_id, 0, "base", 8)
        model.client = object()
        ran: list[int] = []

        def op(tag: int):
            return lambda _model: ran.append(tag) or tag

        def encode(result):
            return "json", {"result": result}

        # Parallel chunks arrive out of order: 3 and 2 must wait for 1.
        p3 = registry.submit(model, 3, "ForwardBackward", op(3), encode)
        p2 = registry.submit(model, 2, "ForwardBackward", op(2), encode)
        await asyncio.sleep(0.05)
        assert ran == []
        p1 = registry.submit(model, 1, "ForwardBackward", op(1), encode)
        await asyncio.wait_for(asyncio.gather(p1.done.wait(), p2.done.wait(), p3.done.wait()), 10)
        # The SDK re-sends seq 2 after a lost response: same promise, no second run.
        again = registry.submit(model, 2, "ForwardBackward", op(2), encode)
        await asyncio.sleep(0.05)
        return ran, again is p2, p3.payload

    ran, same_promise, payload = asyncio.run(scenario())
    assert ran == [1, 2, 3]
    assert same_promise
    assert payload == {"result": 3}


def test_a_quick_request_waits_for_a_blocking_one_ahead_of_it():
    """Quick ops are called on the loop, but never ahead of a thread-bound op queued before them."""
    import time

    async def scenario() -> list[str]:
        registry = Registry(engine=None, promises=PromiseTable())
        session = registry.create_session("0.38.0", [])
        model = registry.new_model(session.session_id, 0, "base", 8)
        model.client = object()
        ran: list[str] = []

        def slow_load(_model):
            time.sleep(0.2)
            ran.append("load")

        def encode(result):
            return "json", {}

        p1 = registry.submit(model, 1, "LoadWeights", slow_load, encode)
        p2 = registry.submit(model, 2, "OptimStep", lambda _m: ran.append("optim"), encode, quick=True)
        p3 = registry.submit(model, 3, "OptimStep", lambda _m: ran.append("optim2"), encode, quick=True)
        await asyncio.wait_for(asyncio.gather(p1.done.wait(), p2.done.wait(), p3.done.wait()), 10)
        p4 = registry.submit(model, 4, "OptimStep", lambda _m: ran.append("inline"), encode, quick=True)
        await asyncio.wait_for(p4.done.wait(), 10)
        return ran

    assert asyncio.run(scenario()) == ["load", "optim", "optim2", "inline"]


def test_a_failing_request_fails_its_promise_with_a_category():
    async def scenario():
        registry = Registry(engine=None, promises=PromiseTable())
        session = registry.create_session("0.38.0", [])
        model = registry.new_model(session.session_id, 0, "base", 8)
        model.client = object()

        def bad(_model):
            raise ValueError("loss_fn 'nope' is not supported")

        promise = registry.submit(model, 1, "ForwardBackward", bad, lambda r: ("json", r))
        await asyncio.wait_for(promise.done.wait(), 10)
        registry.finish_session(session.session_id, "success")
        return promise.payload, model.model_id in registry.models

    payload, still_there = asyncio.run(scenario())
    assert payload == {"error": "ValueError: loss_fn 'nope' is not supported", "category": "user"}
    assert not still_there
