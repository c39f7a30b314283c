"""Request plumbing: request id, access line and metrics; the drain gate; the request body's limits (413 over
MNEMO_MAX_BODY_BYTES, 408 stalled or not in by the deadline, 429 past the bodies held in memory); 400 for a
repeated single-valued header; HEAD answered as GET."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Callable
from contextvars import ContextVar

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.frame.drain import Drain
from app.frame.errors import HTTP_METHODS, body_too_large_detail
from app.frame.metrics import Metrics
from app.frame.paths import loggable_path
from app.frame.responses import dumps

access_logger = logging.getLogger("mnemo.access")
REQUEST_ID_HEADER = b"x-request-id"
# An incoming id is kept when it is 1 to 128 visible ASCII characters: echoed byte for byte, and no space or
# control character that could forge a field of the access line.
REQUEST_ID = re.compile(rb"[\x21-\x7e]{1,128}")
NOSNIFF = (b"x-content-type-options", b"nosniff")  # browsers take each answer as its Content-Type says
# Methods the metrics name; any other (the HTTP parser takes PROPFIND, M-SEARCH, ...) is counted as "other".
KNOWN_METHODS = frozenset({*HTTP_METHODS, "OPTIONS"})
OPERATIONS_PATHS = frozenset({"/health", "/ready", "/metrics", "/v2/health/live", "/v2/health/ready"})
# perf_counter() when the request being handled reached the app: its deadline and its logged duration count from it,
# and the batcher serves the earliest arrivals first
request_arrival: ContextVar[float | None] = ContextVar("request_arrival", default=None)
# whether the request's client is still connected, as the server's receive() last said (app/transports/http.py's
# `complete` sets it): the batcher drops the rows of a client that left before it runs them
request_connected: ContextVar[Callable[[], bool] | None] = ContextVar("request_connected", default=None)
# the size of the request's body when it is parsed off the loop: the batcher learns what such bodies need
request_body_bytes: ContextVar[int | None] = ContextVar("request_body_bytes", default=None)


async def send_json(send: Send, status: int, payload: dict, headers: dict[str, str] | None = None) -> None:
    body = dumps(payload)
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(key.lower().encode(), value.encode()) for key, value in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


BODIES_IN_MEMORY_BYTES = 32 << 20  # request bodies held at once (being read, parsed or served) before 429
BODIES_BUSY = {"detail": "The server holds too many request bodies; retry after the Retry-After delay."}


class BodySizeLimit:
    """Reject request bodies over `max_bytes` with 413, whether or not they announce a Content-Length,
    and with 408 bodies that stall (no data for `stall_timeout_s`) or are not complete by the request's
    deadline (`deadline_s` after it arrived): trickled a byte at a time, a body would hold its connection
    and its share of the memory budget below for as long as the client likes.

    Bodies held in memory at once are bounded too, by the bytes received (not announced: a client announcing
    1 MB and sending nothing would hold 1 MB of the budget, and 32 such connections would refuse every body):
    a request whose Content-Length does not fit beside the bodies held gets 429 (Retry-After) before it is
    read, and one whose bytes push the total past `in_memory_bytes` while it arrives gets it then. Without
    it, 1,024 clients sending 160 KB each would hold about 330 MB in bodies alone. The connection stays open
    (uvicorn skips the unread body): a close would make clients reconnect, and a storm of reconnects queues
    new connections, such as health probes, behind it.
    """

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        stall_timeout_s: float,
        deadline_s: float,
        metrics: Metrics,
        in_memory_bytes: int = BODIES_IN_MEMORY_BYTES,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.max_bytes = max_bytes
        self.stall_timeout_s = stall_timeout_s
        self.deadline_s = deadline_s
        self.in_memory_bytes = in_memory_bytes
        self.held_bytes = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"").strip()  # the parser keeps trailing spaces
        declared_bytes = int(declared) if declared.isdigit() else 0
        if declared_bytes > self.max_bytes:
            await send_json(send, 413, {"detail": body_too_large_detail(self.max_bytes)}, {"Connection": "close"})
            return
        if declared_bytes and self.held_bytes and self.held_bytes + declared_bytes > self.in_memory_bytes:
            self.metrics.refused("bodies_in_memory")
            await send_json(send, 429, BODIES_BUSY, {"Retry-After": "1"})  # keep-alive: uvicorn skips the unread body
            return
        await self._read_and_call(scope, receive, send)

    async def _read_and_call(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Read the body (each part counted in `held_bytes` as it arrives, until the answer), then call the app."""
        deadline = (request_arrival.get() or time.perf_counter()) + self.deadline_s
        chunks, size, more = [], 0, True
        try:
            while more:
                late = deadline - time.perf_counter() < self.stall_timeout_s  # the deadline comes before a stall
                try:
                    async with asyncio.timeout(min(self.stall_timeout_s, deadline - time.perf_counter())):
                        message = await receive()  # (asyncio.timeout: no task per message, unlike wait_for)
                except TimeoutError:
                    await send_json(send, 408, {"detail": self._timeout_detail(late)}, {"Connection": "close"})
                    return
                if message["type"] == "http.disconnect":
                    return
                chunks.append(message.get("body", b""))
                size += len(chunks[-1])
                self.held_bytes += len(chunks[-1])
                more = message.get("more_body", False)
                if size > self.max_bytes:
                    too_large = {"detail": body_too_large_detail(self.max_bytes)}
                    await send_json(send, 413, too_large, {"Connection": "close"})
                    return
                if self.held_bytes > self.in_memory_bytes and self.held_bytes > size:  # alone, a body may fill it
                    self.metrics.refused("bodies_in_memory")
                    await send_json(send, 429, BODIES_BUSY, {"Retry-After": "1"})
                    return
            await self.app(scope, _replay(b"".join(chunks), receive), send)
        finally:
            self.held_bytes -= size

    def _timeout_detail(self, late: bool) -> str:
        if late:
            return f"The request body was not complete within {self.deadline_s:g} s (MNEMO_REQUEST_TIMEOUT_S)."
        return f"The request body stalled for {self.stall_timeout_s:g} s (MNEMO_BODY_TIMEOUT_S)."


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the app the body already read, in one message, then the connection's own."""
    delivered = False

    async def replay() -> Message:
        nonlocal delivered
        if delivered:
            return await receive()
        delivered = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


class DrainGate:
    """Refuse new work before reading its body: 503 while draining, 429 while the parse queue is saturated.

    Both answers carry Retry-After; the 503 also Connection: close. Work in flight is counted for the drain;
    given up by it (`Drain.give_up`), a request not yet answered gets a 503 too.
    """

    def __init__(self, app: ASGIApp, drain: Drain, saturated: Callable[[], bool], metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics
        self.drain = drain
        self.saturated = saturated

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPERATIONS_PATHS:
            await self.app(scope, receive, send)
            return
        if self.drain.draining:
            self.metrics.refused("draining")
            detail = {"detail": "The server is shutting down and takes no new requests; retry on another replica."}
            await send_json(send, 503, detail, {"Retry-After": "1", "Connection": "close"})
            return
        if scope["method"] == "POST" and self.saturated():
            self.metrics.refused("parse_queue_full")
            detail = {"detail": "The server is busy reading other requests; retry after the Retry-After delay."}
            await send_json(send, 429, detail, {"Retry-After": "1"})
            return
        task = asyncio.current_task()
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        self.drain.enter(task)
        try:
            await self.app(scope, receive, tracking_send)
        except asyncio.CancelledError:
            if not self.drain.gave_up or started:
                raise
            task.uncancel()  # given up by the drain: answered here, in the service's shape
            self.metrics.refused("drain_timeout")
            detail = {"detail": "The server shut down before this request finished (MNEMO_DRAIN_S); retry it."}
            await send_json(send, 503, detail, {"Retry-After": "1", "Connection": "close"})
        finally:
            self.drain.leave(task)


# Headers read as one value: a second copy (which a proxy may read instead of ours: Starlette reads the first, a dict
# of the headers the last) is refused with 400 before anything else reads them. RFC 9110 section 5.3 allows
# repeating only list-valued fields; nginx refuses a repeated Authorization or Content-Length the same way.
SINGLE_HEADERS = {
    b"authorization": "Authorization",
    b"content-type": "Content-Type",
    b"content-encoding": "Content-Encoding",
    b"content-length": "Content-Length",
    REQUEST_ID_HEADER: "X-Request-ID",
    b"inference-header-content-length": "Inference-Header-Content-Length",
}


def repeated_header(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The name of the first header of SINGLE_HEADERS that the request sends more than once, else None."""
    seen: set[bytes] = set()
    for name, _ in headers:
        if name in SINGLE_HEADERS:
            if name in seen:
                return SINGLE_HEADERS[name]
            seen.add(name)
    return None


class SingleHeaders:
    """400 naming the header when a request repeats one that is read as a single value (SINGLE_HEADERS); 400 with
    a close for a body framed both by Transfer-Encoding and Content-Length (RFC 9112 6.1: the server may refuse
    it, and must close the connection after answering it), and for an HTTP version other than 1.0 and 1.1 (the
    parser takes any digit.digit)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["http_version"] not in ("1.0", "1.1"):
            detail = f"HTTP/{scope['http_version']} is not spoken here: send HTTP/1.1."
            await send_json(send, 400, {"detail": detail}, {"Connection": "close"})
            return
        names = {name for name, _ in scope["headers"]}
        if b"transfer-encoding" in names and b"content-length" in names:
            detail = "Transfer-Encoding and Content-Length were both sent: the body's length is ambiguous; send one."
            await send_json(send, 400, {"detail": detail}, {"Connection": "close"})
            return
        name = repeated_header(scope["headers"])
        if name is None:
            await self.app(scope, receive, send)
            return
        detail = f"The header {name} was sent more than once; send it once."
        await send_json(send, 400, {"detail": detail})


class HeadAsGet:
    """HEAD on any path is answered as GET without the body (RFC 9110: a server that serves GET serves HEAD):
    the same status and headers, Content-Length included. The access line and metrics say HEAD."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                if not message.get("more_body", False):
                    await send({"type": "http.response.body", "body": b""})
                return
            await send(message)

        as_get = {**scope, "method": "GET"}
        try:
            await self.app(as_get, receive, headers_only)
        finally:
            if "route" in as_get:  # the route GET matched: the access line and metrics name it, not "unmatched"
                scope["route"] = as_get["route"]


DOCS_ROUTES = ("/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json", "/docs-assets/{asset:path}")


def route_label(scope: Scope) -> str:
    """The template of the route the request matched; for a request answered before routing (413, 401,
    503), the documented template its path fits; "unmatched" only for paths the service does not have."""
    route = scope.get("route")
    if route is not None:
        return route.path
    app = scope.get("app")
    templates = getattr(app.state, "route_templates", None) if app is not None else None
    if templates is None:
        if app is None:
            return "unmatched"
        templates = app.state.route_templates = _route_templates([*app.openapi().get("paths", {}), *DOCS_ROUTES])
    path = scope["path"]
    return next((template for template, pattern in templates if pattern.fullmatch(path)), "unmatched")


def _route_templates(templates: list[str]) -> list[tuple[str, re.Pattern]]:
    def pattern(template: str) -> re.Pattern:
        parts = re.split(r"(\{[^}]+\})", template)
        regex = "".join(
            (".+" if part.endswith(":path}") else "[^/]+") if part.startswith("{") else re.escape(part)
            for part in parts
        )
        return re.compile(regex)

    return [(template, pattern(template)) for template in templates]


def awaits_continue(headers: list[tuple[bytes, bytes]]) -> bool:
    """The request announces a body (chunked, or a Content-Length other than 0) and asks for `100 Continue`."""
    body = any(name == b"transfer-encoding" or (name == b"content-length" and value != b"0") for name, value in headers)
    return body and any(name == b"expect" and value.lower() == b"100-continue" for name, value in headers)


class RequestContext:
    """Give every response an X-Request-ID (and `X-Content-Type-Options: nosniff`), log one access line and record
    metrics, both by route template.

    An answer to a request that asked for `100 Continue`, sent before its body was read to its end (an early 400,
    401, 413 or 429), also says `Connection: close`: the client may then skip the body, and kept alive, the
    connection read its next request as that body (RFC 9110 10.1.1). Without `Expect`, the connection is kept
    and the rest of the body is skipped.
    """

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = [value for name, value in scope["headers"] if name == REQUEST_ID_HEADER]
        kept = len(incoming) == 1 and REQUEST_ID.fullmatch(incoming[0])  # two ids (refused with 400): neither
        request_id = incoming[0].decode() if kept else os.urandom(16).hex()
        started = time.perf_counter()
        request_arrival.set(started)
        status = 499  # no answer was sent: the client left first (a failure is answered 500 by CatchUnexpected)
        body_unread = awaits_continue(scope["headers"])

        async def receive_tracking() -> Message:
            nonlocal body_unread
            message = await receive()
            body_unread = body_unread and message["type"] == "http.request" and message.get("more_body", False)
            return message

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [*message.get("headers", []), (REQUEST_ID_HEADER, request_id.encode()), NOSNIFF]
                if body_unread and not any(name.lower() == b"connection" for name, _ in headers):
                    headers.append((b"connection", b"close"))
                message["headers"] = headers
            await send(message)

        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive_tracking, send_with_id)
        finally:
            self.metrics.in_flight.dec()
            seconds = time.perf_counter() - started
            method = scope["method"] if scope["method"] in KNOWN_METHODS else "other"  # no label per invented method
            self.metrics.observe_request(route_label(scope), method, status, seconds)
            path = loggable_path(scope)  # the route template: no student ids or other client text in logs
            access_logger.info(
                "%s %s %d %.1fms id=%s",
                scope["method"],
                path,
                status,
                seconds * 1000,
                request_id,
                extra={
                    "request_id": request_id,
                    "method": scope["method"],
                    "path": path,
                    "status": status,
                    "duration_ms": round(seconds * 1000, 2),
                },
            )
