"""Errors under /v2 in the protocol's shape: the request edge rewrites another layer's `{"detail": ...}` (401, 404,
405, 413, 429, 503) as `{"error": "<sentence>"}`, the only field clients such as tritonclient read."""

from __future__ import annotations

import orjson
from starlette.types import Message

from app.core.responses import dumps


def is_protocol_path(path: str) -> bool:
    return path == "/v2" or path.startswith("/v2/")


def is_json_error(start: Message) -> bool:
    """Whether a response start is an error (4xx, 5xx) with a JSON body."""
    return start["status"] >= 400 and any(
        key.lower() == b"content-type" and value.split(b";")[0].strip().lower() == b"application/json"
        for key, value in start.get("headers", [])
    )


def protocol_body(body: bytes) -> bytes:
    """`{"detail": "<sentence>"}` as `{"error": "<sentence>"}`; any other body unchanged."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    if not isinstance(payload, dict) or "detail" not in payload or "error" in payload:
        return body
    return dumps({"error": str(payload["detail"])})
