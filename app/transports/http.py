"""What every task route does around its service: `read_body` (validated JSON, 415 for other encodings, large
bodies parsed off the loop or refused 429 when their model has no room) and `complete` (the work within its deadline,
504, unless the client leaves, 499)."""

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


def header(request: Request, name: bytes, default: str) -> str:
    """A header's value from the raw scope (cheaper than Starlette's Headers, built anew for each `request`)."""
    return next((value.decode("latin-1") for key, value in request.scope["headers"] if key == name), default)


def check_identity_encoding(request: Request) -> None:
    """A compressed body (Content-Encoding gzip, br, ...) is 415 naming the coding: bodies are read as sent, and
    inflating them would let a small body take any memory."""
    coding = header(request, b"content-encoding", "identity").strip().lower()
    if coding not in ("", "identity"):
        raise UnsupportedMediaType(
            f"Content-Encoding {coding[:32]!r} is not supported: send the body uncompressed (identity)."
        )


def check_declared_charset(request: Request, content_type: str | None = None) -> None:
    """A Content-Type declaring a charset other than UTF-8 (`charset=latin-1`, `utf-16`) is 415."""
    for parameter in (content_type or header(request, b"content-type", "")).split(";")[1:]:
        name, _, value = parameter.partition("=")
        charset = value.strip().strip('"').lower()
        if name.strip().lower() == "charset" and charset not in UTF8_NAMES:
            raise UnsupportedMediaType(f"charset {charset[:32]!r} is not supported: {UTF8_ONLY}.")


def check_utf8_body(body: bytes) -> None:
    """A byte order mark, or UTF-16/32 (a NUL among the first bytes), is 415 saying so, not a 422 on column 1."""
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
    """The body validated against `schema`; a large one is parsed on a worker thread, holding meanwhile the room its
    size predicts in the model of `task` it names, or refused (429) when there is none (`ModelBatcher.reserve`)."""
    content_type = header(request, b"content-type", "application/json")
    media_type = content_type.split(";")[0].strip().lower()
    if media_type != "application/json" and not media_type.endswith("+json"):
        raise UnsupportedMediaType("Content-Type must be application/json.")
    check_declared_charset(request, content_type)
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
    """`function` on a worker thread, in the bounded parse queue: 429 while it is full (`offload_or_shed`)."""
    try:
        return await offload_or_shed(size, function, *args, **kwargs)
    except ParseQueueFull:
        request.app.state.metrics.refused("parse_queue_full")
        raise


def named_model(request: Request, body: bytes, task: str) -> ServedModel | None:
    """The ready model an unparsed body names in its one `"model"` field (a scan, not a parse), else the default;
    None when ambiguous or unknown (the parsed body is checked in full at admission)."""
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
    """The work's result unless its deadline (MNEMO_REQUEST_TIMEOUT_S, or a shorter `client_timeout_s`, from
    arrival) passes first (504) or the client leaves (499): `within_deadline`."""
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
    """Call `callback` when receive() says the client left, tell the batcher whether it is there; returns how to
    stop. The watch starts at the loop's next turn: work done inline before it costs no task."""
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
    """Returns when the client disconnects (the body is read: receive() reports only that)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


BODY_SCHEMAS: dict[str, type[BaseModel]] = {}  # the bodies routes read themselves, for the OpenAPI components


def json_body(schema: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` documenting a JSON request body that the route reads itself with `read_body`."""
    BODY_SCHEMAS[schema.__name__] = schema
    reference = {"$ref": f"#/components/schemas/{schema.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": reference}}}}
