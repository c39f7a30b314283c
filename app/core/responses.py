"""JSON responses encoded with orjson, which writes numpy arrays directly (no `.tolist()` on the hot path)."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response


def dumps(payload: Any) -> bytes:
    """JSON bytes of a payload that may hold numpy arrays and scalars."""
    return orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)


class JsonResponse(Response):
    """`JsonResponse(payload, status, headers)`; the payload may hold numpy arrays."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return content if isinstance(content, bytes) else dumps(content)
