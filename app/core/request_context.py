"""What the runtime knows of the request it works for, set by whatever transport carried it: the batcher serves the
earliest arrivals first, drops the rows of a client that has left, and sizes the room a large body needs."""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar

# perf_counter() when the request arrived: its deadline and its logged duration count from it
request_arrival: ContextVar[float | None] = ContextVar("request_arrival", default=None)
# whether the request's client is still connected (None: the transport cannot tell)
request_connected: ContextVar[Callable[[], bool] | None] = ContextVar("request_connected", default=None)
# the size of the request's body when it is parsed off the event loop
request_body_bytes: ContextVar[int | None] = ContextVar("request_body_bytes", default=None)
