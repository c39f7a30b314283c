"""The request edge (`RequestEdge`): what every request gets before, while and after the app serves it."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Mapping

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.requests import Request
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.errors import HTTP_METHODS, INTERNAL_ERROR, printable
from app.core.logging import TracebackBudget, loggable_path, route_path
from app.core.request_context import request_arrival
from app.core.settings import split_list
from app.runtime.offload import saturated
from app.transports.access import ApiKeys, JsonCors
from app.transports.error_handlers import EXCHANGE, PARSER_ANSWERED, Refused
from app.transports.http import INLINE_BODY_BYTES

access_logger, errors_logger = logging.getLogger("mnemo.access"), logging.getLogger("mnemo.errors")
LOG_RECORD = {"name": "mnemo.access", "levelno": logging.INFO, "levelname": "INFO", "msg": "%s %s %d %.1fms id=%s"}
REQUEST_ID_HEADER = b"x-request-id"
# an incoming id kept: 1 to 128 visible ASCII characters (no space or control character to forge a log field)
REQUEST_ID = re.compile(rb"[\x21-\x7e]{1,128}")
FIRST_KEY_MODEL = re.compile(rb'\s*\{\s*"model"\s*:\s*"([A-Za-z0-9._-]{1,64})"')  # a body opening with its model
NOSNIFF = (b"x-content-type-options", b"nosniff")  # browsers take each answer as its Content-Type says
KNOWN_METHODS = frozenset({*HTTP_METHODS, "OPTIONS"})  # any other (PROPFIND, ...) is counted as "other"
OPERATIONS_PATHS = frozenset({"/health", "/ready", "/metrics", "/v2/health/live", "/v2/health/ready"})
DOCS_ROUTES = ("/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json", "/docs-assets/{asset:path}")
BODIES_IN_MEMORY_BYTES = 32 << 20  # request bodies held at once (being read, parsed or served) before 429
BODIES_BUSY = "The server holds too many request bodies; retry after the Retry-After delay."
DRAINING = "The server is shutting down and takes no new requests; retry on another replica."
PARSER_BUSY = "The server is busy reading other requests; retry after the Retry-After delay."
GIVEN_UP = "The server shut down before this request finished (MNEMO_DRAIN_S); retry it."
CONNECTIONS_FULL = "More than {} connections are open (MNEMO_MAX_CONNECTIONS); retry after the Retry-After delay."
# Headers read as one value: a second copy (a proxy may read the other) is a 400, as in nginx (RFC 9110 5.3).
SINGLE = "Authorization Content-Type Content-Encoding Content-Length X-Request-ID Inference-Header-Content-Length"
SINGLE_HEADERS = {name.lower().encode(): name for name in SINGLE.split()}
CLOSE, RETRY = {"Connection": "close"}, {"Retry-After": "1"}
Routes = Mapping[tuple[str, str], APIRoute]  # (method, path): the route the edge calls without FastAPI's router
READ_HEADERS = frozenset({*SINGLE_HEADERS, b"host", b"transfer-encoding", b"expect"})  # what the edge reads


def request_id(ids: list[bytes]) -> str:
    """The client's X-Request-ID if it sent one usable id, else a new random one (two ids, a 400: neither)."""
    return ids[0].decode() if len(ids) == 1 and REQUEST_ID.fullmatch(ids[0]) else os.urandom(16).hex()


def refusal(scope: Scope, fields: dict[bytes, list[bytes]]) -> Refused | None:
    """The 400 of framing a proxy may read otherwise (RFC 9112 6.1, 3.2), or of a SINGLE_HEADERS header sent twice."""
    version = scope.get("http_version", "1.1")
    if version not in ("1.0", "1.1"):
        return Refused(400, f"HTTP/{version} is not spoken here: send HTTP/1.1.", CLOSE)
    if b"transfer-encoding" in fields and b"content-length" in fields:
        detail = "Transfer-Encoding and Content-Length were both sent: the body's length is ambiguous; send one."
        return Refused(400, detail, CLOSE)
    if version == "1.1" and len(fields.get(b"host", ())) != 1:
        return Refused(400, "An HTTP/1.1 request carries exactly one Host header (RFC 9112 3.2).", CLOSE)
    for name, values in fields.items():
        if len(values) > 1 and name in SINGLE_HEADERS:
            return Refused(400, f"The header {SINGLE_HEADERS[name]} was sent more than once; send it once.")
    return None


class Exchange:
    """One request at the edge: the headers it reads, its answer's `send` (the edge's headers; 499 until a head) and
    its body's `receive`, checking the body's limits as the app reads it (408, 413, 429)."""

    def __init__(self, edge: RequestEdge, scope: Scope, receive: Receive, send: Send) -> None:
        self.edge, self.scope, self._receive, self._send = edge, scope, receive, send
        self.fields: dict[bytes, list[bytes]] = {}
        for name, value in scope["headers"]:
            if name in READ_HEADERS:
                self.fields.setdefault(name, []).append(value)
        self.rid = scope.get(PARSER_ANSWERED) or request_id(self.fields.get(REQUEST_ID_HEADER, []))
        self.headers = [(REQUEST_ID_HEADER, self.rid.encode()), *edge.headers]
        self.path, self.status, self.started, self.size = route_path(scope), 499, False, 0
        self.done = b"content-length" not in self.fields and b"transfer-encoding" not in self.fields  # no body
        length = self.fields.get(b"content-length", [b""])[0].strip()  # the parser keeps trailing spaces
        self.declared = int(length) if length.isdigit() else 0
        # left unread, a body awaiting `100 Continue` may never come, a chunked one could go on: either closes after
        expects = [value.lower() for value in self.fields.get(b"expect", [])]
        self.close_unread = b"transfer-encoding" in self.fields or b"100-continue" in expects

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status, self.started = message["status"], True
            headers = [*message.get("headers", []), *self.headers]
            unread = self.close_unread or self.edge.drain.draining
            if unread and not any(name.lower() == b"connection" for name, _ in headers):
                headers.append((b"connection", b"close"))
            message = {**message, "headers": headers}
        await self._send(message)

    async def receive(self) -> Message:
        if self.done:
            return await self._receive()
        edge, now, settings = self.edge, time.perf_counter(), self.edge.settings
        stall_s, deadline_s = settings.body_timeout_s, settings.request_timeout_s
        deadline = (request_arrival.get() or now) + deadline_s
        late = deadline - now < stall_s  # the deadline comes before a stall
        try:
            async with asyncio.timeout(min(stall_s, deadline - now)):
                message = await self._receive()
        except TimeoutError:
            limit = f"stalled for {stall_s:g} s (MNEMO_BODY_TIMEOUT_S)"
            limit = f"was not complete within {deadline_s:g} s (MNEMO_REQUEST_TIMEOUT_S)" if late else limit
            raise Refused(408, f"The request body {limit}.", CLOSE) from None
        if message["type"] == "http.disconnect":
            raise Refused(499, "The client disconnected before sending the whole body.")
        chunk = message.get("body", b"")
        self.size += len(chunk)
        edge.held_bytes += len(chunk)
        self.done = not message.get("more_body", False)
        self.close_unread &= not self.done
        if refused := edge.over_limits(self.size, edge.held_bytes):
            raise refused
        if self.size == len(chunk):  # the first part (empty ones aside)
            self.reserve_unread(chunk)
        return message

    def reserve_unread(self, head: bytes) -> None:
        """The 429 (`Overloaded`) of a large body for a route of `app.state.reserving` (path -> task) whose first key
        names a model of that task that would refuse to `reserve` its declared size: raised before the rest is read."""
        state = self.scope["app"].state
        task = state.reserving.get(self.path) if self.declared > INLINE_BODY_BYTES else None
        named = task and FIRST_KEY_MODEL.match(head)
        model = state.registry.models.get(named[1].decode()) if named else None
        if model is not None and model.task == task and model.ready:
            with model.batcher.reserve(self.declared):
                pass  # a trial: `read_body` holds the room while it parses the whole body


class RequestEdge:
    """Outermost first: id, access line and metrics; the 400s; CORS; too many connections (503); API key (401); drain
    gate (503) and parse queue (429) but on operations paths; body size (413, 429); the `direct` routes; a bug's 500."""

    def __init__(self, app: ASGIApp, service: FastAPI, direct: Routes, identity: dict[str, str] | None) -> None:
        state, self.app, self.direct, self.direct_paths = service.state, app, direct, frozenset(p for _, p in direct)
        self.settings = settings = state.settings
        self.api_keys, self.metrics, self.drain = state.api_keys, state.metrics, state.drain
        self.connections = state.connections  # the server's open connections, if it says (app/server.py)
        self.direct_app = ExceptionMiddleware(call_route, service.exception_handlers)  # the app's handlers, as routed
        service.edge = self  # called at once by ServiceApp for the direct routes' paths
        self.admitted = JsonCors(self._admit, cors) if (cors := split_list(settings.cors_origins)) else self._admit
        self.tracebacks, self.held_bytes, self.templates = TracebackBudget(settings.error_log_window_s), 0, None
        self.headers = [NOSNIFF]  # and which process answered: with several workers, or `identity` (a Ray replica)
        if identity is not None or settings.workers > 1:
            self.headers += [(b"x-mnemo-pid", b"%d" % os.getpid())]
            self.headers += [(key.lower().encode(), value.encode()) for key, value in (identity or {}).items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method, arrived = scope["method"], time.perf_counter()
        request_arrival.set(arrived)
        exchange = scope[EXCHANGE] = Exchange(self, scope, receive, send)  # in uvicorn's scope: h11's 400 reads it
        # the app's own copy: routing rewrites it, the edge labels what it received; a HEAD is its GET without the body
        inner = {**scope, "method": "GET" if method == "HEAD" else method}
        if route := self.direct.get((inner["method"], exchange.path)):
            inner["route"] = route  # called by `call_route`, without FastAPI's router
        self.metrics.in_flight.inc()
        try:
            await (refusal(scope, exchange.fields) or self.admitted)(inner, exchange.receive, exchange.send)
        finally:
            del scope[EXCHANGE]  # it holds uvicorn's receive and send, which hold the scope: a cycle left for the gc
            self.held_bytes -= exchange.size
            scope["route"] = inner.get("route")  # a HEAD: the route its GET matched
            self.metrics.in_flight.dec()
            seconds, status = time.perf_counter() - arrived, 400 if PARSER_ANSWERED in scope else exchange.status
            label = self.route_label(scope, exchange.path)
            self.metrics.observe_request(label, method if method in KNOWN_METHODS else "other", status, seconds)
            if access_logger.isEnabledFor(logging.INFO):  # its path the route template: no client text in the logs
                path, rid, ms = loggable_path(scope, exchange.path), exchange.rid, seconds * 1000
                fields = dict(request_id=rid, method=method, path=path, status=status, duration_ms=round(ms, 2))
                values = (method, path, status, ms, rid)  # the record made here: no walk up the stack for a line
                access_logger.handle(logging.makeLogRecord({**LOG_RECORD, "args": values, **fields}))

    async def _admit(self, scope: Scope, receive: Receive, send: Send) -> None:
        exchange: Exchange = scope[EXCHANGE]
        keys, authorization = self.api_keys, exchange.fields.get(b"authorization", [b""])[0]
        refused = keys.refusal(exchange.path, authorization) if keys.keys else None  # no keys: no call
        gated, declared = exchange.path not in OPERATIONS_PATHS, exchange.declared
        if len(self.connections) > (limit := self.settings.max_connections):  # each one a socket: answered, closed
            refused = self._refused("connections", 503, CONNECTIONS_FULL.format(limit), {**RETRY, **CLOSE})
        elif refused is None:
            if gated and self.drain.draining and scope.get("client") not in self.drain.open_before:
                refused = self._refused("draining", 503, DRAINING, {**RETRY, **CLOSE})
            elif gated and scope["method"] == "POST" and saturated():
                refused = self._refused("parse_queue_full", 429, PARSER_BUSY, RETRY)
            elif declared:
                refused = self.over_limits(declared, self.held_bytes + declared)
        if refused is not None:
            await refused(scope, receive, send)
            return
        task = asyncio.current_task()
        if gated:
            self.drain.enter(task)
        try:
            await (self.app if scope.get("route") is None else self.direct_app)(scope, receive, send)
        except asyncio.CancelledError:
            if not (gated and self.drain.gave_up) or exchange.started:
                raise
            task.uncancel()  # given up by the drain: answered here, in the service's shape
            await self._refused("drain_timeout", 503, GIVEN_UP, {**RETRY, **CLOSE})(scope, receive, send)
        except Exception as error:  # a bug: one line, with its traceback when the budget admits it
            with_traceback, repeats = self.tracebacks.admit(error)
            seen = f" (seen {repeats} more time(s) since its last traceback)" if with_traceback and repeats else ""
            where = f"{scope['method']} {loggable_path(scope)}"  # the route template: no client text in the log
            what = f"{type(error).__name__}: {printable(' '.join(str(error).split()))}{seen}"  # one line
            rid, exc_info = exchange.rid, error if with_traceback else None
            errors_logger.error(
                "unexpected error on %s: %s id=%s", where, what, rid, exc_info=exc_info, extra={"request_id": rid}
            )
            if not exchange.started:
                await Refused(500, INTERNAL_ERROR["detail"])(scope, receive, send)
        finally:
            if gated:
                self.drain.leave(task)

    def route_label(self, scope: Scope, path: str) -> str:
        """The matched route's template, else (refused unrouted) the documented one its path fits, or "unmatched"."""
        if (route := scope.get("route")) is not None:
            return route.path
        if self.templates is None:
            paths = [*scope["app"].openapi().get("paths", {}), *DOCS_ROUTES]
            self.templates = [(template, compile_path(template)[0]) for template in paths]
        return next((template for template, regex in self.templates if regex.match(path)), "unmatched")

    def _refused(self, reason: str, status: int, detail: str, headers: dict[str, str]) -> Refused:
        """A refusal, counted under `reason`."""
        self.metrics.refused(reason)
        return Refused(status, detail, headers)

    def over_limits(self, size: int, held: int) -> Refused | None:
        """The 413 of a body past MNEMO_MAX_BODY_BYTES, or the 429 of the bodies `held` past BODIES_IN_MEMORY_BYTES."""
        if size > (limit := self.settings.max_body_bytes):
            detail = f"Request body is larger than the limit of {limit} bytes (MNEMO_MAX_BODY_BYTES)."
            return Refused(413, detail, CLOSE)
        if held > BODIES_IN_MEMORY_BYTES and held > size:
            return self._refused("bodies_in_memory", 429, BODIES_BUSY, RETRY)
        return None


async def call_route(scope: Scope, receive: Receive, send: Send) -> None:
    """The request's direct route, its endpoint called without FastAPI's router."""
    response = await scope["route"].endpoint(Request(scope, receive))
    await response(scope, receive, send)


class ServiceApp(FastAPI):
    """FastAPI with the request edge as its one middleware (`add_edge`), called at once for the paths of its direct
    routes: FastAPI's own wrappers are a share of a small request's time (benchmarks/asgi_overhead.py)."""

    def add_edge(self, direct: Routes, identity: dict[str, str] | None) -> None:
        """The edge of the middleware stack; it reads settings, metrics, drain and API keys (read once) from `state`."""
        self.state.api_keys = ApiKeys(self.state.settings)
        self.add_middleware(RequestEdge, service=self, direct=direct, identity=identity)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.middleware_stack is None:
            self.middleware_stack = self.build_middleware_stack()
        if scope["type"] == "http" and scope["path"] in self.edge.direct_paths:
            scope["app"] = self
            await self.edge(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)
