"""A request's work bounded by its deadline (504) and by its client (499), for REST and gRPC alike: the 504 leaves a
margin that grows with the event loop's lag (an overloaded loop runs timers late); stopped work is cancelled."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

from starlette.datastructures import State
from starlette.types import Receive

from app.core.errors import DeadlineExceeded, ServiceError
from app.core.request_context import request_arrival, request_connected

DEADLINE_MARGIN_S = 0.5  # a 504 leaves this long (plus twice the loop's recent lag) before the deadline
DEADLINE_CHECK_S = 0.25  # the margin is taken again this often: the loop's lag can grow while a request waits
T = TypeVar("T")


class ClientGone(ServiceError):
    """The client disconnected; nobody reads this answer (logged as 499)."""

    status_code = 499


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
    due = (request_arrival.get() or time.perf_counter()) + timeout
    current, loop = asyncio.current_task(), asyncio.get_running_loop()
    stopped_by: list[type[ServiceError]] = []
    awaiting = False  # the task is cancelled only while it awaits the work, never after
    timer: asyncio.TimerHandle | None = None
    starting: asyncio.Handle | None = None
    watcher: asyncio.Future | None = None

    def stop(error: type[ServiceError]) -> None:
        if awaiting and not stopped_by:
            stopped_by.append(error)
            current.cancel()

    def expired() -> DeadlineExceeded:
        metrics.timed_out.labels(model_name).inc()
        return DeadlineExceeded(f"The request did not complete within {timeout:g} s ({source}); retry later.")

    def check_deadline() -> bool:
        """Whether time is left (then checked again in DEADLINE_CHECK_S at most), else stop."""
        nonlocal timer
        margin = min(DEADLINE_MARGIN_S + 2 * state.loop_lag.recent_s, timeout / 2)
        remaining = due - margin - time.perf_counter()
        if remaining <= 0:
            stop(DeadlineExceeded)
            return False
        timer = loop.call_later(min(remaining, DEADLINE_CHECK_S), check_deadline)
        return True

    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    def watch() -> None:
        nonlocal watcher
        watcher = asyncio.ensure_future(disconnected())
        watcher.add_done_callback(lambda _: stop(ClientGone))

    try:
        if not check_deadline():  # expired before the work started
            raise expired()
        if receive is not None:  # watched from the loop's next turn: inline work skips it
            starting = loop.call_soon(watch)
            request_connected.set(lambda: watcher is None or not watcher.done())
        awaiting = True
        return await work
    except asyncio.CancelledError:
        by_batcher = not stopped_by and not current.cancelling()  # it saw the client leave before the transport
        if not by_batcher and (not stopped_by or current.uncancel()):  # cancelled by someone else too (shutdown)
            raise
        if not by_batcher and stopped_by[0] is DeadlineExceeded:
            raise expired() from None
        metrics.cancelled.labels(model_name).inc()
        raise ClientGone("The client disconnected before the answer.") from None
    finally:
        awaiting = False
        work.close()  # a coroutine that never started (the deadline had passed) is closed, not left unawaited
        if timer is not None:
            timer.cancel()
        check_deadline = None  # it calls itself: left, its cycle would hold the request until a garbage collection
        if starting is not None:
            starting.cancel()
        if watcher is not None:
            watcher.cancel()
