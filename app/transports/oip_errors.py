"""Errors under /v2 in the protocol's shape: the request edge rewrites a `{"detail": ...}` error answered by another
layer (401, 404, 405, 413, 429, 503) as `{"error": "<sentence>"}`, the only field clients such as tritonclient read."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.types import Message

from app.core.responses import dumps

PREFIX = "/v2"


def is_protocol_path(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


def is_json_error(start: Message) -> bool:
    """Whether a response start is an error (4xx, 5xx) with a JSON body."""
    return start["status"] >= 400 and any(
        key.lower() == b"content-type" and value.split(b";")[0].strip().lower() == b"application/json"
        for key, value in start.get("headers", [])
    )


def protocol_body(body: bytes) -> bytes:
    """`{"detail": X}` as `{"error": "<sentence>"}`; any other body unchanged."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    if not isinstance(payload, dict) or "detail" not in payload or "error" in payload:
        return body
    return dumps({"error": _sentence(payload["detail"])})


def _sentence(detail: Any) -> str:
    """A detail as one sentence: a string as it is; validation errors as "where: message; ..."."""
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list):
        parts = []
        for item in detail:
            if isinstance(item, dict) and "msg" in item:
                where = ".".join(str(part) for part in item.get("loc", ()))
                parts.append(f"{where}: {item['msg']}" if where else str(item["msg"]))
            else:
                parts.append(str(item))
        return "; ".join(parts)
    return str(detail)
