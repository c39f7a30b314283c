"""Errors under /v2 in the protocol's shape, whoever answers them.

The protocol's endpoints answer `{"error": "<sentence>"}` themselves (oip/routes.py). Other layers answer a
/v2 request before or around them in the frame's `{"detail": ...}`: the API-key check (401), FastAPI's
404 and 405, the body limit (413), the drain gate (503), the busy parser (429). Clients such as
tritonclient read only `error`, so the request edge (app/transports/middleware.py) rewrites such a JSON error
body under the prefix into `{"error": ...}` with `protocol_body`; a list of validation errors becomes one
sentence. Other paths pass through untouched.
"""

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
