"""Which process answered: `X-Mnemo-Pid` on every response of a gunicorn worker (app/server.py) or Ray Serve replica."""

from __future__ import annotations

import os
from typing import Any


class IdentityHeaders:
    """ASGI middleware: add `X-Mnemo-Pid` (this process's id) and any `extra` headers to every HTTP response."""

    def __init__(self, app: Any, extra: dict[str, str] | None = None) -> None:
        self.app = app
        extra_headers = [(name.lower().encode(), value.encode()) for name, value in (extra or {}).items()]
        self.headers = [(b"x-mnemo-pid", str(os.getpid()).encode()), *extra_headers]

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        async def send_with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *self.headers]}
            await send(message)

        await self.app(scope, receive, send_with_headers)
