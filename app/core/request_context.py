"""What the runtime knows of the request it serves (arrival, client still there, body size), set by its transport."""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar

# perf_counter() when the request arrived: its deadline and its logged duration count from it
request_arrival: ContextVar[float | None] = ContextVar("request_arrival", default=None)
# whether the request's client is still connected (None: the transport cannot tell)
request_connected: ContextVar[Callable[[], bool] | None] = ContextVar("request_connected", default=None)
# the size of the request's body when it is parsed off the event loop
request_body_bytes: ContextVar[int | None] = ContextVar("request_body_bytes", default=None)
