"""A request's work bounded by its deadline (504, early by a margin for the event loop's lag) and its client (499)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

from starlette.datastructures import State
from starlette.types import Receive

from app.core.errors import ClientGone, DeadlineExceeded
from app.core.request_context import request_arrival, request_connected

DEADLINE_MARGIN_S = 0.5  # a 504 leaves this long (plus twice the loop's recent lag) before the deadline
DEADLINE_CHECK_S = 0.25  # the margin is taken again this often: the loop's lag can grow while a request waits
T = TypeVar("T")


async def within_deadline(
    work: Coroutine[Any, Any, T],
    state: State,
    model_name: str,
    client_timeout_s: float | None = None,
    client_source: str = "the request's timeout parameter",
    receive: Receive | None = None,
) -> T:
    """The work's result, unless the deadline (MNEMO_REQUEST_TIMEOUT_S or a shorter `client_timeout_s`, from arrival)
    passes first (`DeadlineExceeded`) or the client leaves (`ClientGone`, seen on `receive`): either cancels it."""
    metrics, timeout, source = state.metrics, state.settings.request_timeout_s, "MNEMO_REQUEST_TIMEOUT_S"
    if client_timeout_s is not None and client_timeout_s < timeout:
        timeout, source = client_timeout_s, client_source
    due, loop = (request_arrival.get() or time.perf_counter()) + timeout, asyncio.get_running_loop()
    handles: list[asyncio.Handle] = []  # the next deadline check, and the start of the client's watch
    watcher: asyncio.Future | None = None
    awaiting = False  # the work is stopped only while it is awaited, never after

    def left() -> float:
        return due - min(DEADLINE_MARGIN_S + 2 * state.loop_lag.recent_s, timeout / 2) - time.perf_counter()

    def check(limit: asyncio.Timeout) -> None:
        """`limit` moved to the deadline less the margin, taken again in DEADLINE_CHECK_S at most."""
        if limit.expired():
            return
        limit.reschedule(loop.time() + (remaining := left()))
        if remaining > 0:
            handles[0] = loop.call_later(min(remaining, DEADLINE_CHECK_S), check, limit)

    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    def watch(limit: asyncio.Timeout) -> None:
        nonlocal watcher
        watcher = asyncio.ensure_future(disconnected())
        watcher.add_done_callback(lambda _: awaiting and not limit.expired() and limit.reschedule(loop.time()))

    def expired() -> DeadlineExceeded:
        metrics.timed_out.labels(model_name).inc()
        return DeadlineExceeded(f"The request did not complete within {timeout:g} s ({source}); retry later.")

    try:
        if (remaining := left()) <= 0:  # expired before the work started
            raise expired()
        async with asyncio.timeout(remaining) as limit:
            awaiting = True
            handles.append(loop.call_later(min(remaining, DEADLINE_CHECK_S), check, limit))
            if receive is not None:  # watched from the loop's next turn: inline work skips it
                handles.append(loop.call_soon(watch, limit))
                request_connected.set(lambda: watcher is None or not watcher.done())
            return await work
    except TimeoutError:
        if not limit.expired():  # the work's own
            raise
        if not (watcher and watcher.done() and not watcher.cancelled()):
            raise expired() from None
    except asyncio.CancelledError:
        if asyncio.current_task().cancelling():  # cancelled by someone else (shutdown)
            raise
    finally:
        awaiting = False
        work.close()  # a coroutine that never started (the deadline had passed) is closed, not left unawaited
        for handle in handles:
            handle.cancel()
        check = None  # it calls itself: left, its cycle would hold the request until a garbage collection
        if watcher is not None:
            watcher.cancel()
    metrics.cancelled.labels(model_name).inc()  # the client left, seen by its watch or first by the batcher
    raise ClientGone("The client disconnected before the answer.")
