"""A request's deadline frees what it holds when the request ends: a reference cycle would keep the request's objects
until the next garbage collection, which then costs the event loop time on every request."""

from __future__ import annotations

import asyncio
import gc
import weakref

from app.core.loop_lag import LoopLag
from app.core.metrics import Metrics
from app.transports.deadline import Deadline, within_deadline


async def answer() -> str:
    return "answer"


async def request(watched: list[weakref.ref]) -> str:
    """One request's work within its deadline; `watched` gets a weak reference to its client watch."""

    def watch_client(callback):  # a function: its weak reference says when the deadline let it go
        return lambda: None

    watched.append(weakref.ref(watch_client))
    metrics = Metrics()
    deadline = Deadline("model", metrics, LoopLag(metrics.loop_lag), 30.0, watch_client=watch_client)
    return await within_deadline(answer(), deadline)


def test_a_finished_request_leaves_nothing_for_the_garbage_collector():
    watched: list[weakref.ref] = []
    gc.disable()
    try:
        assert asyncio.run(request(watched)) == "answer"
        assert watched[0]() is None
    finally:
        gc.enable()
