"""The request edge: one ASGI layer giving every request its id, access line and metrics, and its refusals before
the app (400, 401, 408, 413, 429, 503) and after it (500), in the service's JSON shape."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Callable

from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.drain import Drain
from app.core.errors import HTTP_METHODS, INTERNAL_ERROR, Overloaded, body_too_large_detail
from app.core.logging import TracebackBudget, log_fields, log_unexpected, loggable_path
from app.core.metrics import Metrics
from app.core.request_context import request_arrival
from app.core.responses import dumps
from app.core.settings import Settings
from app.transports.access import API_KEY_REQUIRED, api_key_check, with_cors
from app.transports.http import INLINE_BODY_BYTES
from app.transports.oip_errors import is_json_error, is_protocol_path, protocol_body

access_logger = logging.getLogger("mnemo.access")
REQUEST_ID_HEADER = b"x-request-id"
# an incoming id kept: 1 to 128 visible ASCII characters (no space or control character to forge a log field)
REQUEST_ID = re.compile(rb"[\x21-\x7e]{1,128}")
FIRST_KEY_MODEL = re.compile(rb'\s*\{\s*"model"\s*:\s*"([A-Za-z0-9._-]{1,64})"')  # a body opening with its model
NOSNIFF = (b"x-content-type-options", b"nosniff")  # browsers take each answer as its Content-Type says
# methods the metrics name; any other (PROPFIND, M-SEARCH, ...) is counted as "other"
KNOWN_METHODS = frozenset({*HTTP_METHODS, "OPTIONS"})
OPERATIONS_PATHS = frozenset({"/health", "/ready", "/metrics", "/v2/health/live", "/v2/health/ready"})
BODIES_IN_MEMORY_BYTES = 32 << 20  # request bodies held at once (being read, parsed or served) before 429
BODIES_BUSY = {"detail": "The server holds too many request bodies; retry after the Retry-After delay."}
DRAINING = {"detail": "The server is shutting down and takes no new requests; retry on another replica."}
PARSER_BUSY = {"detail": "The server is busy reading other requests; retry after the Retry-After delay."}
GIVEN_UP = {"detail": "The server shut down before this request finished (MNEMO_DRAIN_S); retry it."}
# Headers read as one value: a second copy (a proxy may read another one than ours) is refused with 400 (RFC 9110
# 5.3 allows repeating only list-valued fields; nginx refuses a repeated Authorization or Content-Length too).
SINGLE_HEADERS = {
    b"authorization": "Authorization",
    b"content-type": "Content-Type",
    b"content-encoding": "Content-Encoding",
    b"content-length": "Content-Length",
    REQUEST_ID_HEADER: "X-Request-ID",
    b"inference-header-content-length": "Inference-Header-Content-Length",
}
CLOSE, RETRY = {"Connection": "close"}, {"Retry-After": "1"}
RETRY_AND_CLOSE = {**RETRY, **CLOSE}


async def send_json(send: Send, status: int, payload: dict, headers: dict[str, str] | None = None) -> None:
    body = dumps(payload)
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(key.lower().encode(), value.encode()) for key, value in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def request_id(headers: list[tuple[bytes, bytes]]) -> str:
    """The client's X-Request-ID if it sent one usable id, else a new random one."""
    incoming = [value for name, value in headers if name == REQUEST_ID_HEADER]
    kept = len(incoming) == 1 and REQUEST_ID.fullmatch(incoming[0])  # two ids (refused with 400): neither
    return incoming[0].decode() if kept else os.urandom(16).hex()


def refusal(scope: Scope) -> tuple[str, dict[str, str]] | None:
    """Why the request is refused with 400, and the answer's headers, in one pass over its headers: an HTTP version
    other than 1.0 and 1.1, a body framed both by Transfer-Encoding and Content-Length (RFC 9112 6.1) or an HTTP/1.1
    request without exactly one Host (RFC 9112 3.2), all closing the connection; else a header of SINGLE_HEADERS
    sent twice."""
    version = scope.get("http_version", "1.1")
    if version not in ("1.0", "1.1"):
        return f"HTTP/{version} is not spoken here: send HTTP/1.1.", CLOSE
    seen, hosts, repeated = set(), 0, None
    for name, _ in scope["headers"]:
        if name == b"host":
            hosts += 1
        elif name in SINGLE_HEADERS or name == b"transfer-encoding":
            repeated = repeated or (SINGLE_HEADERS.get(name) if name in seen else None)
            seen.add(name)
    if b"transfer-encoding" in seen and b"content-length" in seen:
        return "Transfer-Encoding and Content-Length were both sent: the body's length is ambiguous; send one.", CLOSE
    if version == "1.1" and hosts != 1:
        return "An HTTP/1.1 request carries exactly one Host header (RFC 9112 3.2).", CLOSE
    return None if repeated is None else (f"The header {repeated} was sent more than once; send it once.", {})


def awaits_continue(headers: list[tuple[bytes, bytes]]) -> bool:
    """The request announces a body (chunked, or a Content-Length other than 0) and asks for `100 Continue`."""
    body = any(name == b"transfer-encoding" or (name == b"content-length" and value != b"0") for name, value in headers)
    return body and any(name == b"expect" and value.lower() == b"100-continue" for name, value in headers)


class Answer:
    """One request's `send`: the request's id and nosniff on its head, no body for HEAD (its GET's head, RFC 9110),
    a JSON error under /v2 rewritten in the protocol's shape; `status` is 499 until a head is sent."""

    def __init__(
        self, send: Send, request_id: str, head: bool, protocol: bool, body_unread: bool, drain: Drain
    ) -> None:
        self._send = send
        self._drain = drain
        self._headers = [(REQUEST_ID_HEADER, request_id.encode()), NOSNIFF]
        self._head = head
        self._protocol = protocol
        self._held: Message | None = None  # a /v2 error's start, sent once its body is rewritten
        self._chunks: list[bytes] = []
        self.status = 499
        self.body_unread = body_unread  # a `100 Continue` request whose body has not been read to its end

    async def receive_tracking(self, receive: Receive) -> Message:
        message = await receive()
        self.body_unread = self.body_unread and message["type"] == "http.request" and message.get("more_body", False)
        return message

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            if self._protocol and is_json_error(message):
                self._held = message
                return
            await self._start(message)
            return
        if message["type"] != "http.response.body":
            await self._send(message)
            return
        if self._held is not None:
            self._chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            body = protocol_body(b"".join(self._chunks))
            start, self._held = self._held, None
            headers = [(key, value) for key, value in start.get("headers", []) if key.lower() != b"content-length"]
            await self._start({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
            message = {"type": "http.response.body", "body": body}
        if self._head:
            if message.get("more_body", False):
                return
            message = {"type": "http.response.body", "body": b""}
        await self._send(message)

    async def _start(self, message: Message) -> None:
        """The head with the edge's headers, and `Connection: close` while draining or before a `100 Continue`
        body was read (the client may skip it: the connection would read its next request as that body)."""
        self.status = message["status"]
        headers = [*message.get("headers", []), *self._headers]
        if (self.body_unread or self._drain.draining) and not any(name.lower() == b"connection" for name, _ in headers):
            headers.append((b"connection", b"close"))
        message["headers"] = headers
        await self._send(message)


class RequestEdge:
    """Outermost first: the id, access line and metrics (`Answer`); the 400s (`refusal`); CORS; the API key (401);
    the drain gate (503 on a connection opened while draining, or given up by the drain) and the parse queue (429),
    operations paths excepted; the body limits (`_read_body_and_call`); a 500 for an exception no handler took."""

    def __init__(
        self,
        app: ASGIApp,
        settings: Settings,
        metrics: Metrics,
        drain: Drain,
        saturated: Callable[[], bool],
        in_memory_bytes: int = BODIES_IN_MEMORY_BYTES,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.drain = drain
        self.saturated = saturated
        self.api_keys = api_key_check(settings)
        self.admitted = with_cors(self._admit, settings)
        self.max_bytes = settings.max_body_bytes
        self.stall_timeout_s = settings.body_timeout_s
        self.deadline_s = settings.request_timeout_s
        self.in_memory_bytes = in_memory_bytes
        self.held_bytes = 0
        self.tracebacks = TracebackBudget(settings.error_log_window_s)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = request_id(scope["headers"])
        arrived = time.perf_counter()
        request_arrival.set(arrived)
        head = scope["method"] == "HEAD"
        protocol = is_protocol_path(scope["path"])
        answer = Answer(send, rid, head, protocol, awaits_continue(scope["headers"]), self.drain)
        inner = {**scope, "method": "GET"} if head else scope
        self.metrics.in_flight.inc()
        try:
            refused = refusal(scope)
            if refused is not None:
                await send_json(answer.send, 400, {"detail": refused[0]}, refused[1])
            else:
                tracked = receive if not answer.body_unread else lambda: answer.receive_tracking(receive)
                await self.admitted(inner, tracked, answer.send)
        finally:
            if head and "route" in inner:  # the route GET matched: the access line and metrics name it
                scope["route"] = inner["route"]
            self.metrics.in_flight.dec()
            self._record(scope, rid, answer.status, time.perf_counter() - arrived)

    def _record(self, scope: Scope, rid: str, status: int, seconds: float) -> None:
        """The request's metrics and access line (its path the route template: no client text in the logs)."""
        method = scope["method"]
        known = method if method in KNOWN_METHODS else "other"
        self.metrics.observe_request(route_label(scope), known, status, seconds)
        path, milliseconds = loggable_path(scope), seconds * 1000
        fields = dict(request_id=rid, method=method, path=path, status=status, duration_ms=round(milliseconds, 2))
        log_fields(
            access_logger, logging.INFO, "%s %s %d %.1fms id=%s", (method, path, status, milliseconds, rid), fields
        )

    async def _admit(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.api_keys is not None:
            challenge = self.api_keys.challenge(scope)
            if challenge is not None:
                await send_json(send, 401, {"detail": API_KEY_REQUIRED}, {"WWW-Authenticate": challenge})
                return
        gated = scope["path"] not in OPERATIONS_PATHS
        if gated and self.drain.refuses(scope.get("client")):
            self.metrics.refused("draining")
            await send_json(send, 503, DRAINING, RETRY_AND_CLOSE)
            return
        if gated and scope["method"] == "POST" and self.saturated():
            self.metrics.refused("parse_queue_full")
            await send_json(send, 429, PARSER_BUSY, RETRY)
            return
        task = asyncio.current_task()
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        if gated:
            self.drain.enter(task)
        try:
            await self._read_body_and_call(scope, receive, tracking_send)
        except asyncio.CancelledError:
            if not (gated and self.drain.gave_up) or started:
                raise
            task.uncancel()  # given up by the drain: answered here, in the service's shape
            self.metrics.refused("drain_timeout")
            await send_json(send, 503, GIVEN_UP, RETRY_AND_CLOSE)
        except Exception as error:
            log_unexpected(self.tracebacks, scope, error)
            if not started:
                await send_json(send, 500, INTERNAL_ERROR)
        finally:
            if gated:
                self.drain.leave(task)

    async def _read_body_and_call(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Read the body, then call the app with it: 413 past `max_bytes`, 408 when it stalls or misses the request's
        deadline, 429 (keeping the connection: reconnects would queue) when the bodies held would pass
        `in_memory_bytes`."""
        headers = dict(scope["headers"])
        if b"content-length" not in headers and b"transfer-encoding" not in headers:  # no body: nothing to hold
            await self.app(scope, receive, send)
            return
        declared = headers.get(b"content-length", b"").strip()  # the parser keeps trailing spaces
        declared_bytes = int(declared) if declared.isdigit() else 0
        if declared_bytes > self.max_bytes:
            await send_json(send, 413, {"detail": body_too_large_detail(self.max_bytes)}, CLOSE)
            return
        if declared_bytes and self.held_bytes and self.held_bytes + declared_bytes > self.in_memory_bytes:
            self.metrics.refused("bodies_in_memory")
            await send_json(send, 429, BODIES_BUSY, RETRY)
            return
        deadline = (request_arrival.get() or time.perf_counter()) + self.deadline_s
        chunks, size, more = [], 0, True
        try:
            while more:
                late = deadline - time.perf_counter() < self.stall_timeout_s  # the deadline comes before a stall
                try:
                    async with asyncio.timeout(min(self.stall_timeout_s, deadline - time.perf_counter())):
                        message = await receive()  # (asyncio.timeout: no task per message, unlike wait_for)
                except TimeoutError:
                    limit = (
                        f"was not complete within {self.deadline_s:g} s (MNEMO_REQUEST_TIMEOUT_S)"
                        if late
                        else f"stalled for {self.stall_timeout_s:g} s (MNEMO_BODY_TIMEOUT_S)"
                    )
                    await send_json(send, 408, {"detail": f"The request body {limit}."}, CLOSE)
                    return
                if message["type"] == "http.disconnect":
                    return
                chunks.append(message.get("body", b""))
                size += len(chunks[-1])
                self.held_bytes += len(chunks[-1])
                more = message.get("more_body", False)
                if size > self.max_bytes:
                    await send_json(send, 413, {"detail": body_too_large_detail(self.max_bytes)}, CLOSE)
                    return
                if self.held_bytes > self.in_memory_bytes and self.held_bytes > size:  # alone, a body may fill it
                    self.metrics.refused("bodies_in_memory")
                    await send_json(send, 429, BODIES_BUSY, RETRY)
                    return
                refused = len(chunks) == 1 and self._refused_unread(scope, declared_bytes, chunks[0])
                if refused:
                    await send_json(send, 429, {"detail": refused}, RETRY)
                    return
            await self.app(scope, _replay(b"".join(chunks), receive), send)
        finally:
            self.held_bytes -= size

    @staticmethod
    def _refused_unread(scope: Scope, declared_bytes: int, head: bytes) -> str | None:
        """The 429 of a large body for a route of `app.state.reserving` (path -> task) whose first key names a model
        of that task that would refuse to `reserve` its declared size: given before the rest is read, not after."""
        task = scope["app"].state.reserving.get(scope["path"]) if declared_bytes > INLINE_BODY_BYTES else None
        named = task and FIRST_KEY_MODEL.match(head)
        model = scope["app"].state.registry.models.get(named[1].decode()) if named else None
        if model is None or model.task != task or not model.ready:
            return None
        try:
            with model.batcher.reserve(declared_bytes):
                return None
        except Overloaded as refusal:
            return refusal.detail


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the app the body already read, in one message, then the connection's own."""
    read = iter([{"type": "http.request", "body": body, "more_body": False}])

    async def replay() -> Message:
        return next(read, None) or await receive()

    return replay


DOCS_ROUTES = ("/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json", "/docs-assets/{asset:path}")


def route_label(scope: Scope) -> str:
    """The template of the route the request matched, or (answered before routing: 413, 401, 429, 503) the path of a
    direct route, else the documented template its path fits; "unmatched" only for paths the service does not have."""
    route, app = scope.get("route"), scope.get("app")
    if route is not None or app is None:
        return "unmatched" if route is None else route.path
    if (scope["method"], scope["path"]) in getattr(app, "direct_paths", ()):  # (its template: no openapi() to build)
        return scope["path"]
    if getattr(app.state, "route_templates", None) is None:
        paths = [*app.openapi().get("paths", {}), *DOCS_ROUTES]
        app.state.route_templates = [(template, compile_path(template)[0]) for template in paths]
    return next((template for template, regex in app.state.route_templates if regex.match(scope["path"])), "unmatched")
