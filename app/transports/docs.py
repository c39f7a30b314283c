"""GET /docs (Swagger UI) and /redoc (ReDoc) with their assets served from this process, never from a CDN.

The JavaScript and CSS come from the `fastapi-offline` package (it ships Swagger UI and ReDoc), served
under /docs-assets/; the pages work on an air-gapped network. Each page carries a Content-Security-Policy
that lets the browser load nothing from elsewhere (ReDoc's bundle would fetch its logo from cdn.redoc.ly),
run no script but these files and the page's own inline one (by its hash), and be framed by no site.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Callable
from pathlib import Path

import fastapi_offline
from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from app.transports.access import DOCS_ASSETS_PREFIX

ASSETS_DIR = Path(fastapi_offline.__file__).resolve().parent / "static"
OPENAPI_URL = "/openapi.json"
INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)


def content_security_policy(page: HTMLResponse) -> str:
    """This server only; inline styles (both UIs set them), ReDoc's blob: worker, the page's inline scripts."""
    hashes = " ".join(
        f"'sha256-{base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()}'"
        for script in INLINE_SCRIPT.findall(page.body.decode())
    )
    return (
        f"default-src 'none'; script-src 'self' {hashes}; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
        "font-src 'self' data:; connect-src 'self'; worker-src blob:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    )


def _answering_with_policy(page: HTMLResponse) -> Callable[[], HTMLResponse]:
    """A maker of fresh answers with `page`'s HTML and its Content-Security-Policy (hashed once, here)."""
    headers = {"Content-Security-Policy": content_security_policy(page)}
    return lambda: HTMLResponse(page.body, headers=headers)


def install(app: FastAPI) -> None:
    """Mount the assets and add the two documentation pages (not in the OpenAPI schema)."""
    app.mount(DOCS_ASSETS_PREFIX.rstrip("/"), StaticFiles(directory=ASSETS_DIR), name="docs-assets")
    swagger_page = _answering_with_policy(
        get_swagger_ui_html(
            openapi_url=OPENAPI_URL,
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{DOCS_ASSETS_PREFIX}swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_ASSETS_PREFIX}swagger-ui.css",
            swagger_favicon_url=f"{DOCS_ASSETS_PREFIX}favicon.png",
            oauth2_redirect_url="/docs/oauth2-redirect",
        )
    )
    redirect_page = _answering_with_policy(get_swagger_ui_oauth2_redirect_html())
    redoc_page = _answering_with_policy(
        get_redoc_html(
            openapi_url=OPENAPI_URL,
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{DOCS_ASSETS_PREFIX}redoc.standalone.js",
            redoc_favicon_url=f"{DOCS_ASSETS_PREFIX}favicon.png",
            with_google_fonts=False,
        )
    )

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return swagger_page()

    @app.get("/docs/oauth2-redirect", include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return redirect_page()

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return redoc_page()
