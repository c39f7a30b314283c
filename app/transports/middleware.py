"""The request edge: every request's id, access line and metrics, and its refusals before the app (400, 401, 413, 429,
503), while the app reads the body (408, 413, 429) and after it (500); it calls the direct routes itself."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.drain import Drain
from app.core.errors import HTTP_METHODS, INTERNAL_ERROR, Overloaded, ServiceError, body_too_large_detail
from app.core.logging import TracebackBudget, log_fields, log_unexpected, loggable_path, route_path
from app.core.metrics import Metrics
from app.core.request_context import request_arrival
from app.core.responses import JsonResponse
from app.core.settings import Settings
from app.runtime.offload import saturated
from app.transports.access import API_KEY_REQUIRED, api_key_check, with_cors
from app.transports.http import INLINE_BODY_BYTES
from app.transports.oip_errors import is_protocol_path, protocol_body

access_logger = logging.getLogger("mnemo.access")
REQUEST_ID_HEADER = b"x-request-id"
# an incoming id kept: 1 to 128 visible ASCII characters (no space or control character to forge a log field)
REQUEST_ID = re.compile(rb"[\x21-\x7e]{1,128}")
FIRST_KEY_MODEL = re.compile(rb'\s*\{\s*"model"\s*:\s*"([A-Za-z0-9._-]{1,64})"')  # a body opening with its model
NOSNIFF = (b"x-content-type-options", b"nosniff")  # browsers take each answer as its Content-Type says
KNOWN_METHODS = frozenset({*HTTP_METHODS, "OPTIONS"})  # any other (PROPFIND, ...) is counted as "other"
OPERATIONS_PATHS = frozenset({"/health", "/ready", "/metrics", "/v2/health/live", "/v2/health/ready"})
BODIES_IN_MEMORY_BYTES = 32 << 20  # request bodies held at once (being read, parsed or served) before 429
BODIES_BUSY = "The server holds too many request bodies; retry after the Retry-After delay."
DRAINING = "The server is shutting down and takes no new requests; retry on another replica."
PARSER_BUSY = "The server is busy reading other requests; retry after the Retry-After delay."
GIVEN_UP = "The server shut down before this request finished (MNEMO_DRAIN_S); retry it."
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
FRAMING = (b"content-length", b"transfer-encoding")  # a request with a body has one of them


class Refused(ServiceError, HTTPException):
    """A refusal of the edge: answered by the edge, or raised while the app reads the body and answered by the app's
    exception handlers (an HTTPException too: FastAPI's own body parsing lets those through)."""

    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
        HTTPException.__init__(self, status, detail, headers)

    def response(self) -> JsonResponse:
        return JsonResponse({"detail": self.detail}, self.status_code, headers=self.headers)


def request_id(headers: list[tuple[bytes, bytes]]) -> str:
    """The client's X-Request-ID if it sent one usable id, else a new random one."""
    incoming = [value for name, value in headers if name == REQUEST_ID_HEADER]
    kept = len(incoming) == 1 and REQUEST_ID.fullmatch(incoming[0])  # two ids (refused with 400): neither
    return incoming[0].decode() if kept else os.urandom(16).hex()


def refusal(scope: Scope) -> Refused | None:
    """The 400 of an HTTP version other than 1.0 and 1.1, a body framed both by Transfer-Encoding and Content-Length
    (RFC 9112 6.1) or an HTTP/1.1 request without exactly one Host (RFC 9112 3.2), closing the connection; else of a
    header of SINGLE_HEADERS sent twice."""
    version = scope.get("http_version", "1.1")
    if version not in ("1.0", "1.1"):
        return Refused(400, f"HTTP/{version} is not spoken here: send HTTP/1.1.", CLOSE)
    seen, hosts, repeated = set(), 0, None
    for name, _ in scope["headers"]:
        if name == b"host":
            hosts += 1
        elif name in SINGLE_HEADERS or name == b"transfer-encoding":
            repeated = repeated or (SINGLE_HEADERS.get(name) if name in seen else None)
            seen.add(name)
    if b"transfer-encoding" in seen and b"content-length" in seen:
        detail = "Transfer-Encoding and Content-Length were both sent: the body's length is ambiguous; send one."
        return Refused(400, detail, CLOSE)
    if version == "1.1" and hosts != 1:
        return Refused(400, "An HTTP/1.1 request carries exactly one Host header (RFC 9112 3.2).", CLOSE)
    if repeated is not None:
        return Refused(400, f"The header {repeated} was sent more than once; send it once.")
    return None


class Body:
    """The body's limits, checked as the app reads it (unread, it costs no `100 Continue`): 408, 413, and 429 keeping
    the connection (reconnects would queue)."""

    def __init__(self, edge: RequestEdge, scope: Scope, receive: Receive) -> None:
        self.edge, self.scope, self._receive = edge, scope, receive
        self.size, self.done = 0, False
        # left unread, a body sent only after `100 Continue` may never come, and one with no length (chunked) would
        # be read and thrown away for as long as the client sends: either closes the connection after the answer
        expect = (b"expect", b"100-continue")
        self.close_unread = any(
            (name, value.lower()) == expect or name == b"transfer-encoding" for name, value in scope["headers"]
        )

    async def receive(self) -> Message:
        if self.done:
            return await self._receive()
        edge, now = self.edge, time.perf_counter()
        deadline = (request_arrival.get() or now) + edge.deadline_s
        late = deadline - now < edge.stall_timeout_s  # the deadline comes before a stall
        try:
            async with asyncio.timeout(min(edge.stall_timeout_s, deadline - now)):
                message = await self._receive()
        except TimeoutError:
            limit = (
                f"was not complete within {edge.deadline_s:g} s (MNEMO_REQUEST_TIMEOUT_S)"
                if late
                else f"stalled for {edge.stall_timeout_s:g} s (MNEMO_BODY_TIMEOUT_S)"
            )
            raise Refused(408, f"The request body {limit}.", CLOSE) from None
        if message["type"] == "http.disconnect":
            raise Refused(499, "The client disconnected before sending the whole body.")
        chunk = message.get("body", b"")
        self.size += len(chunk)
        edge.held_bytes += len(chunk)
        self.done = not message.get("more_body", False)
        self.close_unread &= not self.done
        first = self.size == len(chunk)  # nothing (but empty chunks) came before
        refused = edge.over_limits(self.size, edge.held_bytes) or (first and self.refused_unread(chunk))
        if refused:
            raise refused
        return message

    def refused_unread(self, head: bytes) -> Refused | None:
        """The 429 of a large body for a route of `app.state.reserving` (path -> task) whose first key names a model
        of that task that would refuse to `reserve` its declared size: given before the rest is read, not after."""
        declared = declared_bytes(self.scope["headers"])
        task = self.scope["app"].state.reserving.get(route_path(self.scope)) if declared > INLINE_BODY_BYTES else None
        named = task and FIRST_KEY_MODEL.match(head)
        model = self.scope["app"].state.registry.models.get(named[1].decode()) if named else None
        if model is None or model.task != task or not model.ready:
            return None
        try:
            with model.batcher.reserve(declared):
                return None
        except Overloaded as refused:
            return Refused(429, refused.detail, RETRY)


class Answer:
    """One request's `send`: the edge's headers, `Connection: close` while draining or when the body was left unread
    (`Body.close_unread`), /v2 errors in the protocol's shape; `status` is 499 until a head."""

    def __init__(self, send: Send, headers: list[tuple[bytes, bytes]], protocol: bool, drain: Drain, body: Body | None):
        self._send, self._headers, self._protocol, self._drain, self._body = send, headers, protocol, drain, body
        self._held: Message | None = None  # a /v2 error's start, sent once its body is rewritten
        self._held_body = b""
        self.status = 499

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start" and self._protocol and message["status"] >= 400:
            self._held = message
        elif message["type"] == "http.response.start":
            await self._start(message)
        elif self._held is None or message["type"] != "http.response.body":
            await self._send(message)
        elif not message.get("more_body", False):
            body = protocol_body(self._held_body + message.get("body", b""))
            headers = [(key, value) for key, value in self._held.get("headers", []) if key.lower() != b"content-length"]
            await self._start({**self._held, "headers": [*headers, (b"content-length", b"%d" % len(body))]})
            await self._send({"type": "http.response.body", "body": body})
        else:
            self._held_body += message.get("body", b"")

    async def _start(self, message: Message) -> None:
        self.status = message["status"]
        headers = [*message.get("headers", []), *self._headers]
        unread = self._body is not None and self._body.close_unread
        if (unread or self._drain.draining) and not any(name.lower() == b"connection" for name, _ in headers):
            headers.append((b"connection", b"close"))
        await self._send({**message, "headers": headers})


class RequestEdge:
    """Outermost first: id, access line and metrics; the 400s; CORS; API key (401); drain gate (503) and parse queue
    (429) but on operations paths; declared body size (413, 429); the `direct` routes; a 500 no handler took."""

    def __init__(
        self,
        app: ASGIApp,
        settings: Settings,
        metrics: Metrics,
        drain: Drain,
        direct: Mapping[tuple[str, str], APIRoute],
        identity: dict[str, str] | None = None,
    ) -> None:
        self.app, self.metrics, self.drain, self.direct = app, metrics, drain, direct
        self.direct_paths = frozenset(path for _, path in direct)
        self.api_keys = api_key_check(settings)
        self.admitted = with_cors(self._admit, settings)
        self.max_bytes, self.stall_timeout_s = settings.max_body_bytes, settings.body_timeout_s
        self.deadline_s, self.held_bytes = settings.request_timeout_s, 0
        self.tracebacks = TracebackBudget(settings.error_log_window_s)
        self.headers = [NOSNIFF]  # and which process answered: with several workers, or `identity` (a Ray replica)
        if identity is not None or settings.workers > 1:
            self.headers += [(b"x-mnemo-pid", b"%d" % os.getpid())]
            self.headers += [(key.lower().encode(), value.encode()) for key, value in (identity or {}).items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers, method = scope["headers"], scope["method"]
        rid = request_id(headers)
        arrived = time.perf_counter()
        request_arrival.set(arrived)
        body = Body(self, scope, receive) if any(name in FRAMING for name, _ in headers) else None
        answer_headers = [(REQUEST_ID_HEADER, rid.encode()), *self.headers]
        path = route_path(scope)
        answer = Answer(send, answer_headers, is_protocol_path(path), self.drain, body)
        # the app's own copy: routing rewrites it (a Mount its root_path), while the edge labels what it received; a
        # HEAD is its GET without the body
        inner = {**scope, "method": "GET" if method == "HEAD" else method}
        if route := self.direct.get((inner["method"], path)):
            inner["route"] = route  # called by `_call`, without FastAPI's router
        self.metrics.in_flight.inc()
        try:
            refused = refusal(scope)
            if refused is not None:
                await refused.response()(scope, receive, answer.send)
            else:
                await self.admitted(inner, receive if body is None else body.receive, answer.send)
        finally:
            self.held_bytes -= 0 if body is None else body.size
            scope["route"] = inner.get("route")  # a HEAD: the route its GET matched
            self.metrics.in_flight.dec()
            seconds = time.perf_counter() - arrived
            self.metrics.observe_request(
                route_label(scope), method if method in KNOWN_METHODS else "other", answer.status, seconds
            )
            self._log(scope, rid, answer.status, seconds)

    @staticmethod
    def _log(scope: Scope, rid: str, status: int, seconds: float) -> None:
        """The access line, if logged: its path the route template (no client text in the logs)."""
        if not access_logger.isEnabledFor(logging.INFO):
            return
        method, path, milliseconds = scope["method"], loggable_path(scope), seconds * 1000
        fields = dict(request_id=rid, method=method, path=path, status=status, duration_ms=round(milliseconds, 2))
        line = "%s %s %d %.1fms id=%s"
        log_fields(access_logger, logging.INFO, line, (method, path, status, milliseconds, rid), fields)

    async def _admit(self, scope: Scope, receive: Receive, send: Send) -> None:
        authorization = b"" if self.api_keys is None else dict(scope["headers"]).get(b"authorization", b"")
        path = route_path(scope)
        challenge = None if self.api_keys is None else self.api_keys.refusal(path, authorization)
        gated = path not in OPERATIONS_PATHS
        declared = declared_bytes(scope["headers"])
        refused = None
        if challenge is not None:
            refused = Refused(401, API_KEY_REQUIRED, {"WWW-Authenticate": challenge})
        elif gated and self.drain.refuses(scope.get("client")):
            refused = self._refused("draining", 503, DRAINING, RETRY_AND_CLOSE)
        elif gated and scope["method"] == "POST" and saturated():
            refused = self._refused("parse_queue_full", 429, PARSER_BUSY, RETRY)
        elif declared:
            refused = self.over_limits(declared, self.held_bytes + declared)
        if refused is not None:
            await refused.response()(scope, receive, send)
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
            await self._call(scope, receive, tracking_send)
        except asyncio.CancelledError:
            if not (gated and self.drain.gave_up) or started:
                raise
            task.uncancel()  # given up by the drain: answered here, in the service's shape
            await self._refused("drain_timeout", 503, GIVEN_UP, RETRY_AND_CLOSE).response()(scope, receive, send)
        except Exception as error:
            log_unexpected(self.tracebacks, scope, error)
            if not started:
                await Refused(500, INTERNAL_ERROR["detail"]).response()(scope, receive, send)
        finally:
            if gated:
                self.drain.leave(task)

    async def _call(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The app, or the request's direct route, its errors answered by the app's exception handlers."""
        if (route := scope.get("route")) is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            response = await route.endpoint(request)
        except Exception as error:
            handlers = scope["app"].exception_handlers  # the handler of its class or nearest base, as Starlette's
            handler = next((handlers[cls] for cls in type(error).__mro__ if cls in handlers), None)
            if handler is None:
                raise
            response = await handler(request, error)
        await response(scope, receive, send)

    def _refused(self, reason: str, status: int, detail: str, headers: dict[str, str]) -> Refused:
        """A refusal, counted under `reason`."""
        self.metrics.refused(reason)
        return Refused(status, detail, headers)

    def over_limits(self, size: int, held: int) -> Refused | None:
        """413 for a body of `size` bytes past `max_bytes`; 429 when the bodies `held` pass BODIES_IN_MEMORY_BYTES
        (alone, a body may fill it)."""
        if size > self.max_bytes:
            return Refused(413, body_too_large_detail(self.max_bytes), CLOSE)
        if held > BODIES_IN_MEMORY_BYTES and held > size:
            return self._refused("bodies_in_memory", 429, BODIES_BUSY, RETRY)
        return None


class ServiceApp(FastAPI):
    """FastAPI with the request edge as its one middleware (`add_edge`), called at once for the paths of the edge's
    direct routes: FastAPI's own wrappers (telemetry, body limit, error middleware) are a share of a small request's
    time (benchmarks/asgi_overhead.py)."""

    edge: RequestEdge

    def add_edge(self, **options: Any) -> None:
        def build(app: ASGIApp) -> RequestEdge:
            self.edge = RequestEdge(app, **options)
            return self.edge

        self.add_middleware(build)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.middleware_stack is None:
            self.middleware_stack = self.build_middleware_stack()
        if scope["type"] == "http" and scope["path"] in self.edge.direct_paths:
            scope["app"] = self
            await self.edge(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)


def declared_bytes(headers: list[tuple[bytes, bytes]]) -> int:
    """The Content-Length, else 0 (the parser keeps trailing spaces)."""
    declared = next((value.strip() for name, value in headers if name == b"content-length"), b"")
    return int(declared) if declared.isdigit() else 0


DOCS_ROUTES = ("/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json", "/docs-assets/{asset:path}")


def route_label(scope: Scope) -> str:
    """The template of the route the request matched (a direct route: before it is called), else (answered before
    routing: 413, 401, 429, 503) the documented template its path fits; "unmatched" for paths the service lacks."""
    route, app = scope.get("route"), scope.get("app")
    if route is not None or app is None:
        return "unmatched" if route is None else route.path
    if getattr(app.state, "route_templates", None) is None:
        paths = [*app.openapi().get("paths", {}), *DOCS_ROUTES]
        app.state.route_templates = [(template, compile_path(template)[0]) for template in paths]
    path = route_path(scope)
    return next((template for template, regex in app.state.route_templates if regex.match(path)), "unmatched")
