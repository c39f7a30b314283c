"""A request's work bounded by its deadline and by its client, whatever transport carried it.

`within_deadline(work, deadline)` awaits the work until it is done, its deadline passes (504: `DeadlineExceeded`),
or the client leaves (`ClientGone`, nothing is sent); in the last two cases the work is cancelled, which drops
its rows that have not started. The 504 is sent a margin before the deadline: `DEADLINE_MARGIN_S` plus twice the
event loop's recent lag (under overload the loop runs timers late, so a timer set at the deadline itself would
answer after it), taken again every `DEADLINE_CHECK_S` while the request waits, since the lag can grow meanwhile.
REST (app/transports/http.py `complete`) and gRPC (app/transports/grpc) each build a `Deadline` from their own
request and call this.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from app.core.errors import DeadlineExceeded, ServiceError
from app.core.loop_lag import LoopLag
from app.core.metrics import Metrics

DEADLINE_MARGIN_S = 0.5  # a 504 leaves this long (plus twice the loop's recent lag) before the deadline
DEADLINE_CHECK_S = 0.25  # the margin is taken again this often: the loop's lag can grow while a request waits
T = TypeVar("T")
Unsubscribe = Callable[[], None]


class ClientGone(ServiceError):
    """The client disconnected; nobody reads this answer (logged as 499)."""

    status_code = 499


@dataclass(frozen=True)
class Deadline:
    """When a request must be answered and what to say then: `server_timeout_s` (MNEMO_REQUEST_TIMEOUT_S), or
    `client_timeout_s` when the client asked for less (`client_source` names how it asked), counted from
    `arrival` (perf_counter; None: now). `watch_client(callback)` calls back when the client leaves and returns
    how to stop watching (None: the transport cannot tell, or cancels the request's task itself)."""

    model_name: str
    metrics: Metrics
    loop_lag: LoopLag
    server_timeout_s: float
    arrival: float | None = None
    client_timeout_s: float | None = None
    client_source: str = "the request's timeout parameter"
    watch_client: Callable[[Callable[[], None]], Unsubscribe] | None = None

    @property
    def timeout_and_source(self) -> tuple[float, str]:
        if self.client_timeout_s is not None and self.client_timeout_s < self.server_timeout_s:
            return self.client_timeout_s, self.client_source
        return self.server_timeout_s, "MNEMO_REQUEST_TIMEOUT_S"


async def within_deadline(work: Coroutine[Any, Any, T], deadline: Deadline) -> T:
    """The work's result, unless the deadline passes first (`DeadlineExceeded`) or the client leaves (`ClientGone`).

    The work runs in the request's own task (no task of its own: that cost two turns of the event loop).
    A timer at the deadline (less the margin, taken again every DEADLINE_CHECK_S), or the client watch when the
    client leaves, cancels that task; the cancellation is taken back here and answered, as `asyncio.timeout`
    does it.
    """
    metrics, model_name = deadline.metrics, deadline.model_name
    timeout, source = deadline.timeout_and_source
    due = (time.perf_counter() if deadline.arrival is None else deadline.arrival) + timeout
    current = asyncio.current_task()
    stopped_by: list[type[ServiceError]] = []
    awaiting = False  # the task is cancelled only while it awaits the work, never after

    def stop(error: type[ServiceError]) -> None:
        if awaiting and not stopped_by:
            stopped_by.append(error)
            current.cancel()

    def client_left() -> None:
        stop(ClientGone)

    def expired() -> DeadlineExceeded:
        metrics.timed_out.labels(model_name).inc()
        return DeadlineExceeded(f"The request did not complete within {timeout:g} s ({source}); retry later.")

    def time_left() -> float:
        """Seconds until the 504 must be sent: the deadline less a margin for the event loop's current lag."""
        margin = min(DEADLINE_MARGIN_S + 2 * deadline.loop_lag.recent_s, timeout / 2)
        return due - margin - time.perf_counter()

    loop = asyncio.get_running_loop()
    timer: asyncio.TimerHandle | None = None

    def check_deadline() -> None:
        nonlocal timer
        remaining = time_left()
        if remaining <= 0:
            stop(DeadlineExceeded)
        else:
            timer = loop.call_later(min(remaining, DEADLINE_CHECK_S), check_deadline)

    unsubscribe: Unsubscribe | None = None
    try:
        remaining = time_left()
        if remaining <= 0:  # expired before the work started
            raise expired()
        if deadline.watch_client is not None:
            unsubscribe = deadline.watch_client(client_left)
        timer = loop.call_later(min(remaining, DEADLINE_CHECK_S), check_deadline)
        awaiting = True
        return await work
    except asyncio.CancelledError:
        if not stopped_by and not current.cancelling():
            # Not this task: the batcher cancelled the rows it awaited, having seen their client leave
            # before the transport did.
            metrics.cancelled.labels(model_name).inc()
            raise ClientGone("The client disconnected before the answer.") from None
        if not stopped_by or current.uncancel():  # cancelled by someone else too (the server's shutdown)
            raise
        if stopped_by[0] is DeadlineExceeded:
            raise expired() from None
        metrics.cancelled.labels(model_name).inc()
        raise ClientGone("The client disconnected before the answer.") from None
    finally:
        awaiting = False
        work.close()  # a coroutine that never started (the deadline had passed) is closed, not left unawaited
        if timer is not None:
            timer.cancel()
        if unsubscribe is not None:
            unsubscribe()
