"""HTTP/1.1 connections that cannot be held open or filled by a client: uvicorn's httptools protocol, guarded.

uvicorn closes idle keep-alive connections (`timeout_keep_alive`) and answers 503 past
`limit_concurrency`, but only once a request's headers are in; it has no limit on header size with
httptools, no deadline for the headers, and no limit on how long a client may leave a response unread.
This protocol adds, per connection:

- a connection cap: a connection accepted beyond MNEMO_MAX_CONNECTIONS is answered 503 and closed with a
  short lingering close (below; a plain close while REFUSALS_LINGERING_MAX such connections are open), so it
  holds a file handle for REFUSAL_LINGER_S at most (the listener keeps accepting);
- a header deadline: a request line and headers not complete MNEMO_HEADER_TIMEOUT_S after the
  connection opened (or after the first byte of a later request) get 408 and the connection is closed;
- a header size cap: a request line and headers over MNEMO_MAX_HEADER_BYTES get 431 and a close, whether
  they arrive in one piece or trickle in;
- a write deadline: a response the client stops reading (the socket buffer stays full) for
  MNEMO_WRITE_TIMEOUT_S aborts the connection, which frees the buffered response;
- pipelined requests parsed at most PIPELINE_MAX ahead of the one being answered (the rest is held unparsed
  and reading paused until an answer goes out);
- reads of at most READ_CHUNK_BYTES, and the rest of a body answered before it was read (an early 429 on a
  kept-alive connection) skipped as body, never counted as the next request's headers;
- when the client goes before its answer, the callables the app added to the list in the request's scope
  under ON_CLIENT_GONE are called at once (the request's work is cancelled, which drops its queued rows in the
  same turn of the loop, before the batcher can start them);
- the scope's RECEIVED_AT is when the request's first bytes were parsed, so that its deadline and logged
  duration include the time it waited for the app under load;
- the scope's CLIENT_CONNECTED callable asks the kernel whether the client has closed or reset its side
  (TCP_INFO), so that the batcher skips a departed client's rows even while an overloaded event loop has
  not yet read the close;
- a response's head goes out with its first body part (`HeadWithBody`): one send() and one TCP segment for
  a small answer instead of two, so the client is woken once;
- a lingering close, as nginx does it: an answer that closes the connection while the client is still sending its
  request (a 413 before the body was read, a stalled body's 408, a drain's 503, a malformed request's 400, a 431 for
  headers over the cap, the cap's 503) sends FIN after the answer, then reads and discards what the client still
  sends, until the client closes, LINGER_S (REFUSAL_LINGER_S) pass or LINGER_MAX_BYTES arrive. A plain close would
  leave unread bytes in the socket, so the kernel would answer the client with a reset, and a client that writes its
  whole request before it reads (urllib, raw sockets) would get "connection reset" instead of the answer.

A stalled request body, or one not complete by the request's deadline, is the app's concern (`BodySizeLimit`,
MNEMO_BODY_TIMEOUT_S and MNEMO_REQUEST_TIMEOUT_S, 408).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from app.core.responses import dumps
from app.transports.middleware import CLIENT_CONNECTED, NOSNIFF, RECEIVED_AT

logger = logging.getLogger("mnemo.connections")
# Read at most this much per recv(): uvicorn buffers a request body up to 64 KB before it pauses reading, so
# a connection holds about 128 KB, not 320 KB, and 1,024 connections sending large bodies at once hold
# about 130 MB less (peak RSS under the overload mix, BENCHMARKS.md).
READ_CHUNK_BYTES = 64 << 10
ON_CLIENT_GONE = "mnemo.on_client_gone"  # scope key: the list of callables to call if the client leaves early
TCP_CLOSE_WAIT, TCP_CLOSE = 8, 7  # Linux TCP states (tcpi_state, TCP_INFO's first byte): the peer sent FIN or RST
COALESCE_MAX_BYTES = 64 << 10  # a larger body part is written after the head rather than copied behind it
REASONS = {
    400: b"Bad Request",
    408: b"Request Timeout",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}
MALFORMED_DETAIL = "Malformed HTTP request: its request line, a header or its framing is invalid."
# Pipelined requests parsed ahead of the one being answered, at most (uvicorn parses all it reads, and resumes
# reading after every answer: a client sending requests faster than they are answered made the queue, about 2 KB
# a request, grow without limit: 2 MB of pipelined GET /health on one connection took 113 MB).
PIPELINE_MAX = 16
PARSE_SLICE_BYTES = 4096  # the parser is fed this much at a time, so the pipeline is checked between slices
LINGER_S = 2.0  # a lingering close reads what the client still sends for at most this long,
LINGER_MAX_BYTES = 16 << 20  # and at most this much
REFUSAL_LINGER_S = 0.5  # a connection over the cap lingers this long at most (it only needs its request read),
REFUSALS_LINGERING_MAX = 64  # and only while at most this many over the cap are open; beyond, a plain close


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int
    header_timeout_s: float
    max_header_bytes: int
    write_timeout_s: float
    on_refused: Callable[[], None] = lambda: None  # a connection answered 503 past max_connections (a metric)
    # a request answered here, before the app, for what it sent: "malformed" (400), "headers_too_large" (431) or
    # "header_timeout" (408) (a metric)
    on_bad_request: Callable[[str], None] = lambda reason: None


class HeadWithBody:
    """The transport of one request as uvicorn's request cycle sees it: the response head (the cycle's first
    write that is not an interim 1xx) is held and written together with the first body part.

    `flush()` writes a head still held: when the response completes without a body write (a response to
    HEAD) and before a close, which is the connection's `close` (a lingering one where the request is still
    arriving). Everything but `write` and `close` is the connection's transport itself.
    """

    def __init__(self, transport: asyncio.Transport, close: Callable[[], None]) -> None:
        self._transport = transport
        self._close = close
        self._head: bytes | None = None
        self._head_seen = False

    def write(self, data: bytes) -> None:
        if not self._head_seen and not data.startswith(b"HTTP/1.1 1"):
            self._head, self._head_seen = data, True
            return
        if self._head is not None and len(data) <= COALESCE_MAX_BYTES:
            data, self._head = self._head + data, None
        self.flush()
        self._transport.write(data)

    def flush(self) -> None:
        if self._head is not None:
            head, self._head = self._head, None
            self._transport.write(head)

    def close(self) -> None:
        self.flush()
        self._close()

    def __getattr__(self, name: str):
        return getattr(self._transport, name)


def _write_head_with_body(cycle: RequestResponseCycle, close: Callable[[], None]) -> None:
    """Give the request cycle a `HeadWithBody` transport, flushed when its response completes (a response to
    HEAD writes no body) and closed with `close`."""
    transport = HeadWithBody(cycle.transport, close)
    respond = cycle.on_response

    def on_response() -> None:
        transport.flush()
        respond()

    cycle.transport, cycle.on_response = transport, on_response


def _close_if_body_not_sent(cycle: RequestResponseCycle) -> None:
    """Answer with Connection: close (and a lingering close) a request that asked for 100 Continue and is answered
    before it got it (a 400, 401 or 429 before the body is read): the client may then skip the body and send its
    next request, which the connection would read as that body (RFC 9110 10.1.1; Go's server closes too)."""
    send = cycle.send

    async def send_closing(message: dict) -> None:
        if message["type"] == "http.response.start" and cycle.waiting_for_100_continue and cycle.more_body:
            cycle.keep_alive = False
        await send(message)

    cycle.send = send_closing


def guarded_protocol(limits: ConnectionLimits) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol class with these limits (pass it as `uvicorn.Config(http=...)`)."""
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), {"limits": limits})


def peer_gone(sock: socket.socket) -> bool:
    """True once the peer closed or reset its side of this TCP connection, as the kernel sees it now, before
    the event loop reads the close; False where TCP_INFO is unavailable. A half-close counts as gone, as
    uvicorn treats it."""
    try:
        return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] in (TCP_CLOSE_WAIT, TCP_CLOSE)
    except (AttributeError, OSError):  # no TCP_INFO on this platform, or not a TCP socket (a Unix socket)
        return False


class RefusalLog:
    """One warning per second at most for connections refused over the cap, with how many there were."""

    def __init__(self, interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self.last_logged = float("-inf")
        self.unlogged = 0

    def note(self, open_connections: int) -> None:
        self.unlogged += 1
        now = time.monotonic()
        if now - self.last_logged >= self.interval_s:
            logger.warning(
                "%d connection(s) answered 503 and closed: %d open (MNEMO_MAX_CONNECTIONS)",
                self.unlogged,
                open_connections,
            )
            self.last_logged, self.unlogged = now, 0


_refusals = RefusalLog()


class HeadersTooLarge(Exception):
    """Raised from a parser callback to stop parsing a request whose headers are over the cap."""


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    limits: ConnectionLimits

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if hasattr(transport, "max_size"):  # asyncio's socket transport: bytes read per recv() (256 KB)
            transport.max_size = READ_CHUNK_BYTES
        super().connection_made(transport)
        self._awaiting_headers = True
        self._in_body = False  # the parser is inside a request body
        self._body_left = 0  # bytes of the request body still to come, by its Content-Length (0: unknown or none)
        self._header_bytes = self._parsed_header_bytes = 0
        self._headers_too_large = False
        self._header_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._linger_timer: asyncio.TimerHandle | None = None
        self._discarded_bytes: int | None = None  # bytes read since a lingering close began; None: not lingering
        self._held_back = bytearray()  # bytes read but not parsed while the pipeline is full
        if len(self.connections) > self.limits.max_connections:
            _refusals.note(len(self.connections) - 1)
            self.limits.on_refused()
            few = len(self.connections) <= self.limits.max_connections + REFUSALS_LINGERING_MAX
            detail = "Too many open connections; retry later."
            self._answer_and_close(503, detail, retry_after=True, linger_s=REFUSAL_LINGER_S if few else 0)
            return
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is not None and not cycle.response_complete:
            for cancel in cycle.scope.get(ON_CLIENT_GONE, ()):
                cancel()

    def data_received(self, data: bytes) -> None:
        if self._discarded_bytes is not None:
            self._discard(len(data))
        elif self._held_back:
            self._held_back += data  # behind bytes that wait for the pipeline to shorten
            self.flow.pause_reading()
        else:
            self._feed(data)

    def _feed(self, data: bytes) -> None:
        """Parse `data` a slice at a time; once PIPELINE_MAX requests wait behind the one being answered, keep
        the rest unparsed and stop reading until an answer goes out (`on_response_complete`). The rest of a body
        of known length is one slice: it holds no request, and slicing a flood of large bodies cost 10% of the
        429s the loop could answer."""
        start = 0
        while start < len(data):
            if self.transport.is_closing() or self._discarded_bytes is not None:
                return
            if len(self.pipeline) >= PIPELINE_MAX:
                self._held_back = bytearray(data[start:])
                self.flow.pause_reading()
                return
            size = self._body_left if self._in_body and self._body_left > PARSE_SLICE_BYTES else PARSE_SLICE_BYTES
            self._parse(data[start : start + size])
            start += size

    def _parse(self, data: bytes) -> None:
        if self._awaiting_headers and self._header_timer is None:
            self._arm_header_timer()  # the first byte of a request on a kept-alive connection
        was_awaiting = self._awaiting_headers  # bytes of a body that ended in this chunk are not headers
        super().data_received(data)
        if was_awaiting and self._awaiting_headers and not self.transport.is_closing():
            self._header_bytes += len(data)
            if self._header_bytes > self.limits.max_header_bytes:
                self._reject_large_headers()

    def _reject_large_headers(self) -> None:
        logger.warning("request headers over %d bytes: 431", self.limits.max_header_bytes)
        detail = "Request line and headers are too large (MNEMO_MAX_HEADER_BYTES)."
        self.limits.on_bad_request("headers_too_large")
        self._answer_and_close(431, detail, linger_s=LINGER_S)  # the client may still be sending them

    def on_url(self, url: bytes) -> None:
        self._count_header_bytes(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_header_bytes(len(name) + len(value) + 4)
        if name.lower() == b"content-length" and value.strip().isdigit():  # (trailing spaces kept) else: refused
            self._body_left = int(value)
        super().on_header(name, value)

    def on_body(self, body: bytes) -> None:
        self._body_left = max(0, self._body_left - len(body))
        super().on_body(body)

    def _count_header_bytes(self, size: int) -> None:
        """Headers that arrive in one piece are measured as they are parsed (streamed ones in data_received)."""
        self._parsed_header_bytes += size
        if self._parsed_header_bytes > self.limits.max_header_bytes:
            self._headers_too_large = True
            raise HeadersTooLarge  # httptools stops parsing; uvicorn answers through send_400_response

    def send_400_response(self, msg: str) -> None:
        """A request the parser refused: 431 if its headers were too large, else a 400 in the service's shape
        (JSON, request id; uvicorn's is plain text), with a lingering close as the client may still be sending."""
        if self._headers_too_large:
            self._reject_large_headers()
        else:
            self.limits.on_bad_request("malformed")
            self._answer_and_close(400, MALFORMED_DETAIL, linger_s=LINGER_S)

    def on_message_begin(self) -> None:
        self._unset_keepalive_if_required()  # armed by a body that ended in these same bytes (on_message_complete)
        self._parsed_header_bytes = 0
        self._body_left = 0
        super().on_message_begin()
        self.scope[RECEIVED_AT] = time.perf_counter()  # the request's deadline counts from here

    def on_headers_complete(self) -> None:
        self.scope[CLIENT_CONNECTED] = self._client_connected
        self.scope[ON_CLIENT_GONE] = []
        self._awaiting_headers = False
        self._in_body = True
        self._header_bytes = 0
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().on_headers_complete()
        _write_head_with_body(self.cycle, self._close_after_answer)
        if self.cycle.waiting_for_100_continue:
            _close_if_body_not_sent(self.cycle)

    def on_response_complete(self) -> None:
        # Next come the headers of a new request (uvicorn's keep-alive timer covers the wait), unless a
        # pipelined request whose headers are already in starts now.
        # The body of a request answered before it was read (an early 429) may still be arriving: then the
        # next headers come after it (on_message_complete).
        self._awaiting_headers = not self.pipeline and not self._in_body
        super().on_response_complete()  # (it resumes reading)
        if self._held_back and len(self.pipeline) < PIPELINE_MAX:
            held, self._held_back = bytes(self._held_back), bytearray()
            self._feed(held)
        if self._held_back:
            self.flow.pause_reading()

    def on_message_complete(self) -> None:
        """A body ends. If it was answered before it was read (an early 429 or 400), the connection is idle from
        here: uvicorn's keep-alive timer, armed by the answer and cancelled by every read of the body since, is
        armed again (else the connection stayed open for good)."""
        self._in_body = False
        super().on_message_complete()
        if self.cycle is not None and self.cycle.response_complete and not self.pipeline:
            self._awaiting_headers = True
            self._unset_keepalive_if_required()
            idle = self.timeout_keep_alive
            self.timeout_keep_alive_task = self.loop.call_later(idle, self.timeout_keep_alive_handler)

    def _close_after_answer(self) -> None:
        """Close the connection after its answer: at once, or lingering while its request's body is arriving."""
        if self._in_body:
            self._linger(LINGER_S)
        else:
            self.transport.close()

    def _linger(self, seconds: float) -> None:
        """The lingering close (module docstring): FIN after the answer, then discard what arrives until the
        client closes, `seconds` pass or LINGER_MAX_BYTES arrive."""
        transport = self.transport
        if transport.is_closing() or not transport.can_write_eof():
            transport.close()
            return
        self._discarded_bytes = 0
        transport.write_eof()  # FIN once the answer is written
        transport.resume_reading()  # uvicorn pauses reading while a body it holds is unread
        self._linger_timer = self.loop.call_later(seconds, transport.close)

    def _discard(self, size: int) -> None:
        """Bytes read while lingering: dropped, and the connection closed past LINGER_MAX_BYTES."""
        self._discarded_bytes += size
        if self._discarded_bytes > LINGER_MAX_BYTES:
            self.transport.close()

    def _client_connected(self) -> bool:
        """False once the connection is closing, or the client closed or reset its side (`peer_gone`)."""
        return not self.transport.is_closing() and not peer_gone(self.transport.get_extra_info("socket"))

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.limits.write_timeout_s, self._write_timed_out)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _arm_header_timer(self) -> None:
        self._header_timer = self.loop.call_later(self.limits.header_timeout_s, self._headers_timed_out)

    def _headers_timed_out(self) -> None:
        self._header_timer = None
        if self._awaiting_headers and not self.transport.is_closing():
            self.limits.on_bad_request("header_timeout")
            self._answer_and_close(408, "Request headers not received in time (MNEMO_HEADER_TIMEOUT_S).")

    def _write_timed_out(self) -> None:
        # Also when the transport is already closing (uvicorn's keep-alive timer closes it after the answer):
        # a close waits for the buffer to drain, which a client that does not read never lets happen.
        self._write_timer = None
        logger.warning("client stopped reading for %gs: aborted (MNEMO_WRITE_TIMEOUT_S)", self.limits.write_timeout_s)
        self.transport.abort()

    def _cancel_timers(self) -> None:
        for timer in (self._header_timer, self._write_timer, self._linger_timer):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._write_timer = self._linger_timer = None

    def _answer_and_close(self, status: int, detail: str, retry_after: bool = False, linger_s: float = 0) -> None:
        """Answer `{"detail": ...}` (with a request id, as every answer has) and close the connection, at once or
        (`linger_s` > 0) with a lingering close of that length."""
        self._awaiting_headers = False
        self._cancel_timers()
        text = dumps({"detail": detail})
        head = [
            b"HTTP/1.1 %d %s" % (status, REASONS[status]),
            b"content-type: application/json",
            b"content-length: %d" % len(text),
            b"connection: close",
            b"x-request-id: " + os.urandom(16).hex().encode(),
            b"%s: %s" % NOSNIFF,
        ]
        if retry_after:
            head.append(b"retry-after: 1")
        self.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + text)
        if linger_s:
            self._linger(linger_s)
        else:
            self.transport.close()
