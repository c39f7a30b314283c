"""Errors under /v2 in the protocol's shape, whoever answers them.

The protocol's endpoints answer `{"error": "<sentence>"}` themselves (routes.py). Other layers answer a
/v2 request before or around them in the frame's `{"detail": ...}`: the API-key check (401), FastAPI's
404 and 405, the body limit (413), the drain gate (503), the busy parser (429). Clients such as
tritonclient read only `error`, so this middleware rewrites such a JSON error body under the prefix into
`{"error": ...}`; a list of validation errors becomes one sentence. Other paths pass through untouched.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.responses import dumps

PREFIX = "/v2"


class ProtocolErrorShape:
    """Rewrite `{"detail": ...}` error bodies of requests under PREFIX as `{"error": "<sentence>"}`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path != PREFIX and not path.startswith(PREFIX + "/"):
            await self.app(scope, receive, send)
            return
        held: Message | None = None  # an error's start, sent once its body is rewritten
        chunks: list[bytes] = []

        async def reshaping_send(message: Message) -> None:
            nonlocal held
            if message["type"] == "http.response.start" and message["status"] >= 400 and _is_json(message):
                held = message
                return
            if held is None or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            body = protocol_body(b"".join(chunks))
            headers = [(key, value) for key, value in held.get("headers", []) if key.lower() != b"content-length"]
            await send({**held, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, reshaping_send)


def _is_json(start: Message) -> bool:
    return any(
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
