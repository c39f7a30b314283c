"""What every task route does around its service: read the body off the loop, admit, deadline, disconnect.

- `read_body(request, Schema, task)`: the JSON body validated by pydantic (small bodies inline, large ones
  on a worker thread); a non-JSON content type, a compressed body or one not in UTF-8 (a declared charset, a
  byte order mark, UTF-16/32) is 415; errors are the service's bounded 422. A large body holds, while it is
  parsed, the room its size predicts in the model it names, and is refused (429) before parsing when there is
  none: under overload the worker threads then parse only requests that will run, and the event loop keeps its
  share of the GIL.
- `complete(request, work)`: awaits the work until it is done, its deadline (MNEMO_REQUEST_TIMEOUT_S, or
  a shorter one the client asked for, counted from arrival) passes (504), or the client disconnects (499,
  nothing is sent): app/transports/deadline.py, the server's receive() telling when the client goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from app.core.errors import InvalidBody, ServiceError, body_errors
from app.core.request_context import request_arrival, request_body_bytes, request_connected
from app.runtime.model import ServedModel
from app.runtime.offload import ParseQueueFull, offload_or_shed
from app.runtime.registry import ModelRegistry
from app.transports.deadline import Deadline, within_deadline
from app.transports.json_input import parse_body

INLINE_BODY_BYTES = 8192  # smaller bodies are validated on the loop: faster than a thread hop
MODEL_KEY = b'"model"'
MODEL_VALUE = re.compile(rb'\s*:\s*(null|"[A-Za-z0-9._-]{1,64}")')
UTF8_NAMES = frozenset({"utf-8", "utf8"})
UTF8_ONLY = "request bodies must be UTF-8 JSON without a byte order mark (RFC 8259)"
Body = TypeVar("Body", bound=BaseModel)
T = TypeVar("T")
P = ParamSpec("P")


class UnsupportedMediaType(ServiceError):
    status_code = 415


def registry(request: Request) -> ModelRegistry:
    return request.app.state.registry


def alone(request: Request) -> bool:
    """This request is the only one the server is handling: its small jobs may run on the event loop."""
    return request.app.state.drain.alone()


def check_identity_encoding(request: Request) -> None:
    """A compressed body (Content-Encoding gzip, br, ...) is 415 naming the coding: bodies are read as sent, and
    inflating them would let a small body take any memory."""
    coding = request.headers.get("content-encoding", "identity").strip().lower()
    if coding not in ("", "identity"):
        raise UnsupportedMediaType(
            f"Content-Encoding {coding[:32]!r} is not supported: send the body uncompressed (identity)."
        )


def json_content_type(request: Request) -> bool:
    media_type = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    return media_type == "application/json" or media_type.endswith("+json")


def check_declared_charset(request: Request) -> None:
    """A Content-Type declaring a charset other than UTF-8 (`charset=latin-1`, `utf-16`) is 415."""
    for parameter in request.headers.get("content-type", "").split(";")[1:]:
        name, _, value = parameter.partition("=")
        charset = value.strip().strip('"').lower()
        if name.strip().lower() == "charset" and charset not in UTF8_NAMES:
            raise UnsupportedMediaType(f"charset {charset[:32]!r} is not supported: {UTF8_ONLY}.")


def check_utf8_body(body: bytes) -> None:
    """A body starting with a byte order mark, or in UTF-16/32 (a NUL among its first bytes: never in UTF-8 JSON,
    whose first two characters are ASCII), is 415 saying so, not a 422 "invalid JSON at column 1"."""
    if body.startswith(b"\xef\xbb\xbf"):
        raise UnsupportedMediaType(f"The body starts with a UTF-8 byte order mark: {UTF8_ONLY}.")
    if body.startswith((b"\xfe\xff", b"\xff\xfe")) or b"\x00" in body[:4]:
        raise UnsupportedMediaType(f"The body is in UTF-16 or UTF-32: {UTF8_ONLY}.")


def validate(schema: type[Body], body: bytes) -> Body:
    """Parse and validate; a failure carries its bounded 422 payload, built here rather than on the loop."""
    try:
        return parse_body(schema, body)
    except ValidationError as error:
        raise InvalidBody(body_errors(error)) from None


async def read_body(request: Request, schema: type[Body], task: str | None = None) -> Body:
    """The request body validated against `schema`; large bodies are parsed on a worker thread (or shed: 429).

    With `task`, a large body holds the room its size predicts in the model it names while it is parsed, and
    is refused (429) before parsing when there is none (`ModelBatcher.reserve`).
    """
    if not json_content_type(request):
        raise UnsupportedMediaType("Content-Type must be application/json.")
    check_declared_charset(request)
    check_identity_encoding(request)
    body = await request.body()
    check_utf8_body(body)
    if len(body) <= INLINE_BODY_BYTES:
        return validate(schema, body)
    request_body_bytes.set(len(body))
    model = None if task is None else named_model(request, body, task)
    with contextlib.nullcontext() if model is None else model.batcher.reserve(len(body)):
        return await parse_off_loop(request, len(body), validate, schema, body)


async def parse_off_loop(request: Request, size: int, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`function` (parsing or decoding a body of `size` bytes) on a worker thread, in the bounded parse queue:
    429 (counted as parse_queue_full) while it is full (`offload_or_shed`)."""
    try:
        return await offload_or_shed(size, function, *args, **kwargs)
    except ParseQueueFull:
        request.app.state.metrics.refused("parse_queue_full")
        raise


def named_model(request: Request, body: bytes, task: str) -> ServedModel | None:
    """The ready model an unparsed body will use: its one top-level-looking `"model"` field, else the default.

    A cheap scan, not a parse: None when the body names no model unambiguously (several matches, escapes)
    or the model is unknown; the parsed body is checked again in full at admission.
    """
    at = body.find(MODEL_KEY)
    if at < 0:
        name = None
    else:
        value = MODEL_VALUE.match(body, at + len(MODEL_KEY))
        if value is None or body.find(MODEL_KEY, at + 1) >= 0 or body[at - 1 : at] == b"\\":
            return None
        name = None if value[1] == b"null" else value[1][1:-1].decode()
    try:
        return registry(request).get(name, task)
    except ServiceError:
        return None


async def complete(
    request: Request, work: Coroutine[Any, Any, T], model_name: str, client_timeout_s: float | None = None
) -> T:
    """The work's result, unless the deadline passes first (504) or the client leaves (499): `within_deadline`
    (app/transports/deadline.py) with MNEMO_REQUEST_TIMEOUT_S, or `client_timeout_s` (the request's own
    `timeout`) when shorter, counted from the request's arrival."""
    state = request.app.state
    deadline = Deadline(
        model_name,
        state.metrics,
        state.loop_lag,
        state.settings.request_timeout_s,
        request_arrival.get(),
        client_timeout_s,
        watch_client=functools.partial(_watch_client, request),
    )
    return await within_deadline(work, deadline)


def _watch_client(request: Request, callback: Callable[[], None]) -> Callable[[], None]:
    """Call `callback` when the server's receive() says the client left (the body has been read, so it only
    reports that), and tell the batcher whether the client is still there; returns how to stop watching. The
    watch starts at the event loop's next turn: work done before it (a run inline on the loop) costs no task."""
    watcher: asyncio.Future | None = None

    def watch() -> None:
        nonlocal watcher
        watcher = asyncio.ensure_future(_disconnected(request))
        watcher.add_done_callback(lambda _: callback())

    def stop() -> None:
        starting.cancel()
        if watcher is not None:
            watcher.cancel()

    starting = asyncio.get_running_loop().call_soon(watch)
    request_connected.set(lambda: watcher is None or not watcher.done())
    return stop


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects (the body has been read, so receive() only reports that)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


_BODY_SCHEMAS: dict[str, type[BaseModel]] = {}


def json_body(schema: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` documenting a JSON request body that the route reads itself with `read_body`."""
    _BODY_SCHEMAS[schema.__name__] = schema
    reference = {"$ref": f"#/components/schemas/{schema.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": reference}}}}


def add_body_schemas(openapi: dict[str, Any]) -> dict[str, Any]:
    """Put the schemas of the bodies declared with `json_body` into the OpenAPI components."""
    components = openapi.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in _BODY_SCHEMAS.items():
        document = schema.model_json_schema(ref_template="#/components/schemas/{model}")
        for nested_name, nested in document.pop("$defs", {}).items():
            components.setdefault(nested_name, nested)
        components[name] = document
    return openapi
