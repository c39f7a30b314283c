"""A request's deadline frees what it holds when the request ends: a reference cycle would keep the request's task
and what it refers to until the next garbage collection, which then costs the event loop time on every request."""

from __future__ import annotations

import asyncio
import gc
import weakref

from starlette.datastructures import State

from app.core.loop_lag import LoopLag
from app.core.metrics import Metrics
from app.core.settings import Settings
from app.transports.deadline import within_deadline


async def answer() -> str:
    return "answer"


async def request(tasks: list[weakref.ref]) -> str:
    """One request's work within its deadline, on its own task; `tasks` gets a weak reference to that task."""
    tasks.append(weakref.ref(asyncio.current_task()))
    metrics = Metrics()
    state = State({"metrics": metrics, "loop_lag": LoopLag(metrics.loop_lag), "settings": Settings()})
    return await within_deadline(answer(), state, "model", receive=asyncio.Event().wait)


async def serve_one(tasks: list[weakref.ref]) -> str:
    return await asyncio.create_task(request(tasks))


def test_a_finished_request_leaves_nothing_for_the_garbage_collector():
    tasks: list[weakref.ref] = []
    gc.disable()
    try:
        assert asyncio.run(serve_one(tasks)) == "answer"
        assert tasks[0]() is None, "the request's task outlived it: a reference cycle holds it"
    finally:
        gc.enable()
