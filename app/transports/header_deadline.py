"""uvicorn's h11 protocol with MNEMO_HEADER_TIMEOUT_S and a lingering close (uvicorn has neither); h11's JSON 400."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import h11
from uvicorn.config import HTTP_PROTOCOLS
from uvicorn.importer import import_from_string

from app.core.logging import route_path
from app.core.responses import JsonResponse

# uvicorn's h11 protocol, resolved as uvicorn resolves its own `http="h11"` option (not imported from its module)
H11Protocol: Any = import_from_string(HTTP_PROTOCOLS["h11"])
MALFORMED = {"detail": "Malformed HTTP request: its request line, a header or its framing is invalid."}
LINGER_S = 2.0  # a lingering close drops what the client still sends for at most this long (nginx's lingering_time)
LINGER_MAX_BYTES = 16 << 20  # and at most this much


class HeadWithBody(h11.Connection):
    """h11's connection, a response's head held for its first body part: uvicorn writes an answer in one call."""

    held = b""

    def send(self, event: h11.Event) -> bytes | None:
        data = super().send(event)
        if isinstance(event, h11.Response):
            self.held, data = data, b""  # uvicorn's write of nothing is no write
        elif self.held and data is not None:
            self.held, data = b"", self.held + data
        return data


class LingeringClose:
    """The transport, its close() lingering (nginx's lingering_close) while the client is still `sending` the request
    answered: FIN, then what comes is dropped until the client closes, LINGER_S pass or LINGER_MAX_BYTES come. A plain
    close on unread bytes makes the kernel reset: a client that sends all before reading (urllib) loses the answer."""

    def __init__(self, transport: asyncio.Transport, sending: Callable[[], bool]) -> None:
        self.socket_transport, self.sending, self.dropped = transport, sending, -1  # bytes dropped; -1: not lingering

    def __getattr__(self, name: str) -> Any:
        """The transport's method, kept on this object: uvicorn's calls of each request then find it at once."""
        setattr(self, name, method := getattr(self.socket_transport, name))
        return method

    def is_closing(self) -> bool:
        return self.dropped >= 0 or self.socket_transport.is_closing()

    def close(self) -> None:
        """Linger while the client is still sending, else close; once lingering, the timer or `drop` closes."""
        transport = self.socket_transport
        if self.dropped >= 0:
            return
        if self.sending() and transport.can_write_eof() and not transport.is_closing():
            self.dropped = 0
            transport.write_eof()  # once the answer is written
            transport.resume_reading()
            asyncio.get_running_loop().call_later(LINGER_S, transport.close)
        else:
            transport.close()

    def drop(self, data: bytes) -> None:
        self.dropped += len(data)
        if self.dropped > LINGER_MAX_BYTES:
            self.socket_transport.close()


class HeaderDeadline(H11Protocol):
    """Closes unanswered (as nginx's client_header_timeout) a connection whose request's headers, or unread body's rest,
    have not come within `timeout_s`; the idle time between requests stays uvicorn's keep-alive."""

    def __init__(self, *args: Any, timeout_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # uvicorn's config, server_state, app_state
        self.conn = HeadWithBody(h11.SERVER, self.config.h11_max_incomplete_event_size)
        self.header_timeout_s = timeout_s
        self.metrics = getattr(getattr(self.config.app, "state", None), "metrics", None)  # create_app's, if the app
        self.header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(LingeringClose(transport, lambda: self.conn.their_state in (h11.SEND_BODY, h11.ERROR)))
        self.timed(True)

    def data_received(self, data: bytes) -> None:
        if self.transport.dropped >= 0:  # lingering
            self.transport.drop(data)
            return
        super().data_received(data)
        # a new request's first bytes on a kept-alive connection, or an unread body's rest: timed; its headers in: not
        self.timed(self.conn.their_state is h11.IDLE or self.unread_rest())

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.timed(self.unread_rest())  # the client owes the rest of a body the answer left unread

    def unread_rest(self) -> bool:
        """Whether the client owes the rest of a body after its answer (uvicorn discards it as it comes)."""
        return self.conn.their_state is h11.SEND_BODY and self.cycle is not None and self.cycle.response_complete

    def connection_lost(self, exc: Exception | None) -> None:
        self.timed(False)
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """The service's JSON 400 with a request id (a refused body's: its request's, in its path's shape); a close."""
        # imported here: app/server.py imports this module before PROMETHEUS_MULTIPROC_DIR is set (read at import)
        from app.transports.error_handlers import EXCHANGE, PARSER_ANSWERED, is_protocol_path
        from app.transports.middleware import NOSNIFF, REQUEST_ID_HEADER, request_id

        scope = self.cycle.scope if self.cycle is not None and not self.cycle.response_complete else {}  # a body's
        ids = [value for name, value in self.headers if name == REQUEST_ID_HEADER] if scope else []
        rid = scope[EXCHANGE].rid if EXCHANGE in scope else request_id(ids)  # the edge's, if the app has begun
        payload = {"error": MALFORMED["detail"]} if scope and is_protocol_path(route_path(scope)) else MALFORMED
        answer = JsonResponse(payload, 400, headers={"Connection": "close", "X-Request-ID": rid})
        head = h11.Response(status_code=400, headers=[*answer.raw_headers, NOSNIFF], reason=b"Bad Request")
        with contextlib.suppress(h11.LocalProtocolError):  # the app's answer has begun: nothing more can be said
            for event in (head, h11.Data(data=answer.body), h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
            scope[PARSER_ANSWERED] = rid  # the request's access line records this 400
        self.transport.close()
        if self.cycle is not None:  # the app's answer to come has no connection left: dropped, as after a disconnect
            self.cycle.disconnected = True

    def timed(self, owed: bool) -> None:
        """The deadline started while the client owes bytes (kept if running: it counts from the first), or stopped."""
        if owed and self.header_timer is None:
            self.header_timer = self.loop.call_later(self.header_timeout_s, self.expire)
        elif not owed and self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def expire(self) -> None:
        self.header_timer = None
        if (self.conn.their_state is h11.IDLE or self.unread_rest()) and not self.transport.is_closing():
            self.transport.socket_transport.close()  # no lingering for a client that stopped sending
            if self.metrics is not None:
                self.metrics.header_timeouts.inc()
