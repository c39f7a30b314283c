"""A request's deadline frees what it holds when the request ends: a reference cycle would keep the request's task
and what it refers to until the next garbage collection, which then costs the event loop time on every request."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest
from starlette.datastructures import State

from app.core.errors import DeadlineExceeded
from app.core.loop_lag import LoopLag
from app.core.metrics import Metrics
from app.core.settings import Settings
from app.transports.deadline import ClientGone, within_deadline


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


def deadline_state(timeout_s: float) -> State:
    metrics = Metrics()
    settings = Settings(request_timeout_s=timeout_s)
    return State({"metrics": metrics, "loop_lag": LoopLag(metrics.loop_lag), "settings": settings})


async def disconnecting_after(seconds: float) -> dict:
    await asyncio.sleep(seconds)
    return {"type": "http.disconnect"}


def test_work_past_the_deadline_is_stopped_504_and_counted():
    state, stopped = deadline_state(30), []

    async def slow() -> str:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            stopped.append(True)
            raise
        return "late"

    async def scenario() -> None:
        started = asyncio.get_running_loop().time()
        with pytest.raises(DeadlineExceeded, match=r"within 0\.6 s \(the client's\)"):
            await within_deadline(slow(), state, "m", 0.6, "the client's", receive=asyncio.Event().wait)
        assert asyncio.get_running_loop().time() - started < 1  # the margin: before 0.6 s, not after 5
        assert asyncio.current_task().cancelling() == 0  # the deadline's own cancellation is taken back

    asyncio.run(scenario())
    assert stopped == [True]
    assert 'mnemo_requests_timed_out_total{model="m"} 1.0' in state.metrics.render().decode()


def test_a_client_that_leaves_stops_the_work_with_client_gone_and_is_counted():
    state = deadline_state(30)

    async def scenario() -> None:
        with pytest.raises(ClientGone):
            await within_deadline(asyncio.sleep(5), state, "m", receive=lambda: disconnecting_after(0.05))

    asyncio.run(scenario())
    assert 'mnemo_requests_cancelled_total{model="m"} 1.0' in state.metrics.render().decode()


def test_a_cancellation_from_elsewhere_and_the_work_s_own_timeout_pass_through():
    state = deadline_state(30)

    async def times_out() -> None:
        raise TimeoutError("the store's own")

    async def scenario() -> None:
        with pytest.raises(TimeoutError, match="the store's own"):
            await within_deadline(times_out(), state, "m", receive=asyncio.Event().wait)
        task = asyncio.create_task(within_deadline(asyncio.sleep(5), state, "m", receive=asyncio.Event().wait))
        await asyncio.sleep(0.05)
        task.cancel()  # a shutdown
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    text = state.metrics.render().decode()
    assert 'mnemo_requests_cancelled_total{model="m"}' not in text and 'timed_out_total{model="m"}' not in text
