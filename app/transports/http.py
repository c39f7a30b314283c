"""The tasks' routes (`task_router`) and what every JSON route reads: `read_body`, validated UTF-8 JSON (else 415)
with a large body parsed off the loop or refused 429, documented with `json_body`."""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from pydantic import BaseModel, ValidationError

from app.core.errors import InvalidInput, ServiceError
from app.core.request_context import request_body_bytes
from app.core.responses import JsonResponse
from app.runtime.model import Endpoint, ServedModel, Task
from app.runtime.offload import ParseQueueFull, offload_or_shed
from app.transports.deadline import within_deadline
from app.transports.error_handlers import EXCHANGE, Refused

INLINE_BODY_BYTES = 8192  # smaller bodies are validated on the loop: faster than a thread hop
MODEL_KEY = b'"model"'
MODEL_VALUE = re.compile(rb'\s*:\s*(null|"[A-Za-z0-9._-]{1,64}")')
SURROGATE = re.compile("[\ud800-\udfff]")
LONE_SURROGATE = "must be valid Unicode text (it holds a lone UTF-16 surrogate)"
KEY_SURROGATE = "field names must be valid Unicode text (one holds a lone UTF-16 surrogate)"
NON_FINITE = "must be a finite number (NaN, Infinity and overflowing numbers are not allowed)"
UTF8_ONLY = "request bodies must be UTF-8 JSON without a byte order mark (RFC 8259)"
Body = TypeVar("Body", bound=BaseModel)


async def utf8_body(request: Request, json_only: bool = False) -> bytes:
    """The body, or 415 naming the problem: before it is read, a media type other than JSON (with `json_only`), a
    charset other than UTF-8 or a compression (inflated, a small body could fill memory); then a BOM or UTF-16/32."""
    fields = request.scope[EXCHANGE].fields  # the edge's one pass over the headers (each of these sent once)
    media_type, *parameters = fields.get(b"content-type", [b"application/json"])[0].decode("latin-1").split(";")
    if json_only and (kind := media_type.strip().lower()) != "application/json" and not kind.endswith("+json"):
        raise Refused(415, "Content-Type must be application/json.")
    for parameter in parameters:
        name, _, value = parameter.partition("=")
        charset = value.strip().strip('"').lower()
        if name.strip().lower() == "charset" and charset not in ("utf-8", "utf8"):
            raise Refused(415, f"charset {charset[:32]!r} is not supported: {UTF8_ONLY}.")
    coding = fields.get(b"content-encoding", [b""])[0].decode("latin-1").strip().lower()
    if coding not in ("", "identity"):
        raise Refused(415, f"Content-Encoding {coding[:32]!r} is not supported: send the body uncompressed (identity).")
    body = b"".join([chunk async for chunk in request.stream()])  # not kept by `request` while it is served
    if body.startswith(b"\xef\xbb\xbf"):
        raise Refused(415, f"The body starts with a UTF-8 byte order mark: {UTF8_ONLY}.")
    if body.startswith((b"\xfe\xff", b"\xff\xfe")) or b"\x00" in body[:2]:  # JSON opens with an ASCII character
        raise Refused(415, f"The body is in UTF-16 or UTF-32: {UTF8_ONLY}.")
    return body


def validate(schema: type[Body], body: bytes | dict[str, Any]) -> Body:
    """`schema` from JSON text or fields; a failure is its bounded 422 (made off the loop too) naming any field."""
    try:
        return schema.model_validate_json(body) if isinstance(body, bytes) else schema.model_validate(body)
    except ValidationError as error:
        errors = error.errors(include_url=False, include_input=False, include_context=False)
        invalid = InvalidInput.from_pydantic(errors, error.error_count(), ("body",))
        if any(listed.kind == "json_invalid" for listed in invalid.listed) and (located := unrepresentable(body)):
            raise located from None
        raise invalid from None


def unrepresentable(body: bytes) -> InvalidInput | None:
    """The first string with a lone UTF-16 surrogate, or non-finite number, in `body` as a 422 (depth-first and
    iterative: a deeply nested body cannot exhaust the stack); None if there is none."""
    try:
        document = json.loads(body, parse_constant=lambda name: float(name.replace("Infinity", "inf")))
    except (ValueError, RecursionError):
        return None
    pending: list[tuple[Any, tuple[str | int, ...]]] = [(document, ("body",))]
    while pending:
        item, where = pending.pop()
        if isinstance(item, str) and SURROGATE.search(item):
            return InvalidInput(where, LONE_SURROGATE)
        if isinstance(item, float) and not math.isfinite(item):
            return InvalidInput(where, NON_FINITE)
        if isinstance(item, dict):
            for key, child in reversed(item.items()):
                if SURROGATE.search(key):
                    return InvalidInput(where, KEY_SURROGATE)
                pending.append((child, (*where, key)))
        elif isinstance(item, list):
            pending.extend((child, (*where, index)) for index, child in reversed(list(enumerate(item))))
    return None


async def read_body(request: Request, schema: type[Body], task: str | None = None) -> Body:
    """The body validated against `schema`; a large one is parsed on a worker thread in the bounded parse queue (429
    while full), holding meanwhile the room its size predicts in the model of `task` it names (429 when none)."""
    body = await utf8_body(request, json_only=True)
    if len(body) <= INLINE_BODY_BYTES:
        return validate(schema, body)
    request_body_bytes.set(len(body))
    model = None if task is None else named_model(request, body, task)
    with contextlib.nullcontext() if model is None else model.batcher.reserve(len(body)):
        try:
            return await offload_or_shed(len(body), validate, schema, body)
        except ParseQueueFull:
            request.app.state.metrics.refused("parse_queue_full")
            raise


def named_model(request: Request, body: bytes, task: str) -> ServedModel | None:
    """The ready model an unparsed body names in its one `"model"` field (a scan, not a parse), else the default;
    None when ambiguous or unknown (the parsed body is checked in full at admission)."""
    at = body.find(MODEL_KEY)
    name = None
    if at >= 0:
        value = MODEL_VALUE.match(body, at + len(MODEL_KEY))
        if value is None or body.find(MODEL_KEY, at + 1) >= 0 or body[at - 1 : at] == b"\\":
            return None
        name = None if value[1] == b"null" else value[1][1:-1].decode()
    with contextlib.suppress(ServiceError):  # unknown or not ready: its admission will say
        return request.app.state.registry.get(name, task)
    return None


BODY_SCHEMAS: dict[str, type[BaseModel]] = {}  # the bodies routes read themselves, for the OpenAPI components


def json_body(schema: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` documenting a JSON request body that the route reads itself with `read_body`."""
    BODY_SCHEMAS[schema.__name__] = schema
    reference = {"$ref": f"#/components/schemas/{schema.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": reference}}}}


def task_router(tasks: Iterable[Task]) -> APIRouter:
    """The routes of every task's endpoints, and the tasks' other routes."""
    router = APIRouter()
    for task in tasks:
        for endpoint in task.endpoints:
            router.add_api_route(
                endpoint.path,
                endpoint_route(task.name, endpoint),
                methods=["POST"],
                name=endpoint.operation_id,
                operation_id=endpoint.operation_id,
                description=endpoint.description,
                response_model=endpoint.response,
                openapi_extra=json_body(endpoint.request),
                tags=[task.tag],
            )
        router.include_router(task.routes, tags=[task.tag])
    return router


def endpoint_route(task_name: str, endpoint: Endpoint) -> Callable[[Request], Awaitable[JsonResponse]]:
    """One endpoint's route: body, model (404/503), batcher admission (429), answer by the deadline (504) or 499."""

    async def route(request: Request) -> JsonResponse:
        body = await read_body(request, endpoint.request, task_name if endpoint.reserve else None)
        model = request.app.state.registry.get(body.model, task_name)
        with endpoint.admit(model, body):
            answer = endpoint.answer(model, body, request.app.state.drain.alone())
            return JsonResponse(await within_deadline(answer, request.app.state, model.name, receive=request.receive))

    return route
