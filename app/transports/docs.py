"""GET /docs (Swagger UI) and /redoc (ReDoc) with their assets (`fastapi-offline`) served from this process, and a
Content-Security-Policy that lets the pages load nothing from elsewhere (they work on an air-gapped network)."""

from __future__ import annotations

import base64
import functools
import hashlib
import re
from pathlib import Path

import fastapi_offline
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from app.transports.access import DOCS_ASSETS_PREFIX

ASSETS_DIR = Path(fastapi_offline.__file__).resolve().parent / "static"
INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)
# this server only; inline styles (both UIs set them), ReDoc's blob: worker, the page's inline scripts by their hashes
POLICY = (
    "default-src 'none'; script-src 'self' {hashes}; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "font-src 'self' data:; connect-src 'self'; worker-src blob:; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)


@functools.lru_cache(maxsize=8)
def pages(app: FastAPI, root: str) -> dict[str, HTMLResponse]:
    """The documentation pages, their URLs below `root` (--root-path, a proxy's prefix), each with its policy."""
    assets, favicon = f"{root}{DOCS_ASSETS_PREFIX}", f"{root}{DOCS_ASSETS_PREFIX}favicon.png"
    built = {
        "/docs": get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{assets}swagger-ui-bundle.js",
            swagger_css_url=f"{assets}swagger-ui.css",
            swagger_favicon_url=favicon,
            oauth2_redirect_url=f"{root}/docs/oauth2-redirect",
        ),
        "/docs/oauth2-redirect": get_swagger_ui_oauth2_redirect_html(),
        "/redoc": get_redoc_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{assets}redoc.standalone.js",
            redoc_favicon_url=favicon,
            with_google_fonts=False,
        ),
    }
    for page in built.values():
        digests = (hashlib.sha256(script.encode()).digest() for script in INLINE_SCRIPT.findall(page.body.decode()))
        hashes = " ".join(f"'sha256-{base64.b64encode(digest).decode()}'" for digest in digests)
        page.headers["Content-Security-Policy"] = POLICY.format(hashes=hashes)
    return built


def install(app: FastAPI) -> None:
    """Mount the assets and add the documentation pages (not in the OpenAPI schema)."""
    app.mount(DOCS_ASSETS_PREFIX.rstrip("/"), StaticFiles(directory=ASSETS_DIR), name="docs-assets")
    for path in pages(app, ""):

        async def page(request: Request, path: str = path) -> HTMLResponse:
            return pages(request.app, request.scope.get("root_path", "").rstrip("/"))[path]

        app.add_route(path, page, methods=["GET"], include_in_schema=False)
