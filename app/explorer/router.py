"""GET / and GET /explorer/<file>: the explorer page and its assets, read from this package only.

Nothing is fetched from elsewhere at run time (no CDN), so the page works air-gapped; the
Content-Security-Policy header makes the browser refuse anything that is not from this server.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse

STATIC_DIR = Path(__file__).parent / "static"
MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
}
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {"Content-Security-Policy": CONTENT_SECURITY_POLICY, "Cache-Control": "no-cache"}


def _asset_files() -> dict[str, Path]:
    """Every servable file under static/, by its URL path; a fixed set, so no path can escape the folder."""
    return {
        path.relative_to(STATIC_DIR).as_posix(): path
        for path in sorted(STATIC_DIR.rglob("*"))
        if path.is_file() and path.suffix in MEDIA_TYPES
    }


ASSETS = _asset_files()
router = APIRouter(tags=["explorer"], include_in_schema=False)


def _file(name: str) -> FileResponse:
    path = ASSETS.get(name)
    if path is None:
        raise HTTPException(status_code=404, detail=f"No explorer file named {name!r}.")
    return FileResponse(path, media_type=MEDIA_TYPES[path.suffix], headers=HEADERS)


@router.get("/")
async def explorer_page() -> FileResponse:
    """The explorer: similarity and knowledge-tracing tabs over this server's API."""
    return _file("index.html")


@router.get("/explorer/{name:path}")
async def explorer_asset(name: str) -> FileResponse:
    """A script, style sheet or icon of the explorer page."""
    return _file(name)
