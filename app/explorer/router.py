"""GET / and GET /explorer/<file>: the explorer page and its files, from this package only (no CDN: it works
air-gapped; its Content-Security-Policy refuses anything from elsewhere), revalidated each time (no-cache, 304)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request, Response
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).parent / "static"
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {"Content-Security-Policy": CONTENT_SECURITY_POLICY, "Cache-Control": "no-cache"}
FILES = StaticFiles(directory=STATIC_DIR)
router = APIRouter(tags=["explorer"], include_in_schema=False)


@router.get("/")
@router.get("/explorer/{name:path}")
async def explorer_file(request: Request) -> Response:
    """/explorer/ and /explorer/index.html redirect to the page: its URLs are relative, to hold behind a path prefix."""
    if (name := request.path_params.get("name")) in ("", "index.html"):
        return RedirectResponse("../")
    response = await FILES.get_response(name or "index.html", request.scope)
    response.headers.update(HEADERS)
    return response
