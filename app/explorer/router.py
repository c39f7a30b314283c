"""GET / and GET /explorer/<file>: the explorer page and its files, from this package only (no CDN: it works
air-gapped; its Content-Security-Policy refuses anything from elsewhere), revalidated each time (no-cache, 304)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).parent / "static"
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {"Content-Security-Policy": CONTENT_SECURITY_POLICY, "Cache-Control": "no-cache"}


class ExplorerFiles(StaticFiles):
    """The files of static/, each answer (200 or 304) with the page's security and cache headers."""

    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers.update(HEADERS)
        return response


FILES = ExplorerFiles(directory=STATIC_DIR)
router = APIRouter(tags=["explorer"], include_in_schema=False)


@router.get("/")
async def explorer_page(request: Request) -> Response:
    """The explorer: similarity and knowledge-tracing tabs over this server's API."""
    return await FILES.get_response("index.html", request.scope)


@router.get("/explorer/{name:path}")
async def explorer_asset(name: str, request: Request) -> Response:
    """A script, style sheet or icon of the explorer page."""
    return await FILES.get_response(name, request.scope)
