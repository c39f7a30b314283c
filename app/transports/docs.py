"""GET /docs (Swagger UI) and /redoc (ReDoc) with their assets served from this process, never from a CDN.

The JavaScript and CSS come from the `fastapi-offline` package (it ships Swagger UI and ReDoc), served
under /docs-assets/; the pages work on an air-gapped network.
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from app.frame.access import DOCS_ASSETS_PREFIX

ASSETS_DIR = Path(fastapi_offline.__file__).resolve().parent / "static"
OPENAPI_URL = "/openapi.json"


def install(app: FastAPI) -> None:
    """Mount the assets and add the two documentation pages (not in the OpenAPI schema)."""
    app.mount(DOCS_ASSETS_PREFIX.rstrip("/"), StaticFiles(directory=ASSETS_DIR), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=OPENAPI_URL,
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{DOCS_ASSETS_PREFIX}swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_ASSETS_PREFIX}swagger-ui.css",
            swagger_favicon_url=f"{DOCS_ASSETS_PREFIX}favicon.png",
            oauth2_redirect_url="/docs/oauth2-redirect",
        )

    @app.get("/docs/oauth2-redirect", include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=OPENAPI_URL,
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{DOCS_ASSETS_PREFIX}redoc.standalone.js",
            redoc_favicon_url=f"{DOCS_ASSETS_PREFIX}favicon.png",
            with_google_fonts=False,
        )
