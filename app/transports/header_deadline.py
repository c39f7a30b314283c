"""A deadline for each request's line and headers, which uvicorn's h11 protocol does not have.

uvicorn arms no timer when a connection opens nor while headers arrive: a connection that sends nothing, or trickles
its headers a byte at a time (slowloris), is held for ever and counts against MNEMO_MAX_CONNECTIONS. HeaderDeadline
wraps uvicorn's H11Protocol (passing every asyncio.Protocol call on) and closes a connection whose request has not
finished its headers MNEMO_HEADER_TIMEOUT_S after the connection opened, or after the request's first byte on a
kept-alive connection; it closes without an answer, as nginx does at client_header_timeout. The idle time between
requests stays uvicorn's keep-alive timeout, and the body's pace is the app's (MNEMO_BODY_TIMEOUT_S).
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.config import HTTP_PROTOCOLS, Config
from uvicorn.importer import import_from_string
from uvicorn.server import ServerState

# uvicorn's h11 protocol, resolved as uvicorn resolves its own `http="h11"` option (not imported from its module)
H11Protocol: type[asyncio.Protocol] = import_from_string(HTTP_PROTOCOLS["h11"])


class HeaderDeadline(asyncio.Protocol):
    """uvicorn's H11Protocol, closed when a request's headers take longer than `timeout_s` (uvicorn's `http=`)."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        timeout_s: float,
    ) -> None:
        self.http = H11Protocol(config, server_state, app_state, _loop)
        self.timeout_s = timeout_s
        self.metrics = getattr(getattr(config.app, "state", None), "metrics", None)  # create_app's, if it is the app
        self.deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.http.connection_made(transport)  # type: ignore[arg-type]
        self.arm()

    def data_received(self, data: bytes) -> None:
        self.http.data_received(data)
        if self.http.conn.their_state is not h11.IDLE:  # the request's headers are in (or the connection failed)
            self.disarm()
        elif self.deadline is None:  # a new request's first bytes on a kept-alive connection
            self.arm()

    def eof_received(self) -> bool | None:
        return self.http.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.disarm()
        self.http.connection_lost(exc)

    def pause_writing(self) -> None:
        self.http.pause_writing()

    def resume_writing(self) -> None:
        self.http.resume_writing()

    def arm(self) -> None:
        self.deadline = self.http.loop.call_later(self.timeout_s, self.expire)

    def disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def expire(self) -> None:
        self.deadline = None
        if self.http.conn.their_state is h11.IDLE and not self.http.transport.is_closing():
            self.http.transport.close()
            if self.metrics is not None:
                self.metrics.header_timeouts.inc()
