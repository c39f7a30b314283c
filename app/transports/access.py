"""Who may call the service: API keys (MNEMO_API_KEYS, MNEMO_API_KEYS_FILE; Bearer, compared in constant time, never
logged) on every path but MNEMO_OPEN_PATHS, the docs and the explorer's static files; and CORS (MNEMO_CORS_ORIGINS)."""

from __future__ import annotations

import hmac

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp

from app.core.settings import Settings, read_keys_file, split_list
from app.transports.error_handlers import Refused

# the docs, and the explorer page "/" (it asks for the key itself, kept in its memory only)
ALWAYS_OPEN = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json", "/"})
DOCS_ASSETS_PREFIX = "/docs-assets/"
OPEN_PREFIXES = (DOCS_ASSETS_PREFIX, "/explorer/")
BINARY_HEADER_LENGTH = "inference-header-content-length"  # the Open Inference Protocol's binary tensor data
API_KEY_REQUIRED = "A valid API key is required: send the header Authorization: Bearer <key>."


class ApiKeys:
    """The API-key check of REST and gRPC on every path but the open ones; no key: authentication is off."""

    def __init__(self, settings: Settings) -> None:
        keys = split_list(settings.api_keys.get_secret_value()) if settings.api_keys else []
        keys += read_keys_file(settings.api_keys_file) if settings.api_keys_file is not None else []
        self.keys = [key.encode() for key in keys]
        self.open_paths = frozenset(split_list(settings.open_paths)) | ALWAYS_OPEN

    def protects(self, path: str) -> bool:
        return bool(self.keys) and path not in self.open_paths and not path.startswith(OPEN_PREFIXES)

    def refusal(self, path: str, authorization: bytes) -> Refused | None:
        """None when a request for `path` with this Authorization value may pass; else its 401."""
        if not self.protects(path):
            return None
        scheme, _, token = authorization.strip().partition(b" ")
        presented = token.strip() if scheme.lower() == b"bearer" and token.strip() else None
        # every key compared (no early exit): the time does not tell which key, or how much of it, matched
        if presented is not None and sum(hmac.compare_digest(presented, key) for key in self.keys):
            return None
        challenge = 'Bearer realm="mnemo"' + ("" if presented is None else ', error="invalid_token"')
        return Refused(401, API_KEY_REQUIRED, {"WWW-Authenticate": challenge})

    def summary(self) -> str:
        """One startup log line: whether API keys are required, and where not."""
        if not self.keys:
            return "authentication: off (no MNEMO_API_KEYS or MNEMO_API_KEYS_FILE)"
        return f"authentication: on ({len(self.keys)} API key(s)); open paths: {', '.join(sorted(self.open_paths))}"


class JsonCors(CORSMiddleware):
    """Starlette's CORS for MNEMO_CORS_ORIGINS, with a refused preflight answered as JSON in its path's shape."""

    def __init__(self, app: ASGIApp, origins: list[str]) -> None:
        super().__init__(
            app,
            allow_origins=origins,
            allow_methods=["GET", "HEAD", "POST", "DELETE"],  # DELETE /students/{id} from a browser app too
            allow_headers=["authorization", "content-type", "x-request-id", BINARY_HEADER_LENGTH],
            expose_headers=["x-request-id", "retry-after", BINARY_HEADER_LENGTH],
            max_age=600,
        )

    def preflight_response(self, request_headers: Headers) -> Response | Refused:
        response = super().preflight_response(request_headers)
        if response.status_code < 400:
            return response
        kept = {key: value for key, value in response.headers.items() if key not in ("content-type", "content-length")}
        detail = f"{response.body.decode()}: the CORS policy (MNEMO_CORS_ORIGINS) does not allow this request."
        return Refused(response.status_code, detail, kept)
