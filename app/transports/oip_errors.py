"""Errors under /v2 in the protocol's shape: the request edge rewrites every `{"detail": ...}` error, the protocol
routes' own included, as `{"error": "<sentence>"}`, the only field clients such as tritonclient read."""

from __future__ import annotations

import orjson

from app.core.responses import dumps


def is_protocol_path(path: str) -> bool:
    return path == "/v2" or path.startswith("/v2/")


def protocol_body(body: bytes) -> bytes:
    """An error's `{"detail": "<sentence>"}` as `{"error": "<sentence>"}`; any other body (not JSON) unchanged."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    if not isinstance(payload, dict) or "detail" not in payload or "error" in payload:
        return body
    return dumps({"error": str(payload["detail"])})
