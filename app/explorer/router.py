"""GET / and GET /explorer/<file>: the explorer page and its assets, read from this package only.

Nothing is fetched from elsewhere at run time (no CDN), so the page works air-gapped; the
Content-Security-Policy header makes the browser refuse anything that is not from this server.
The files are read once, at import. Each carries a strong ETag (a hash of its bytes) and
`Cache-Control: no-cache`: the browser asks again each time, and a matching `If-None-Match` gets a
bodiless 304.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from fastapi import APIRouter, HTTPException, Request, Response

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


@dataclass(frozen=True)
class Asset:
    content: bytes
    media_type: str
    etag: str  # quoted, strong


def _assets() -> dict[str, Asset]:
    """Every servable file under static/, by its URL path; a fixed set, so no path can escape the folder."""
    assets = {}
    for path in sorted(STATIC_DIR.rglob("*")):
        if path.is_file() and path.suffix in MEDIA_TYPES:
            content = path.read_bytes()
            etag = f'"{hashlib.sha256(content).hexdigest()[:32]}"'
            assets[path.relative_to(STATIC_DIR).as_posix()] = Asset(content, MEDIA_TYPES[path.suffix], etag)
    return assets


ASSETS = _assets()
router = APIRouter(tags=["explorer"], include_in_schema=False)


def _matches(if_none_match: str | None, etag: str) -> bool:
    """`If-None-Match` names this ETag (weak comparison, as RFC 9110 asks for it), or is `*`."""
    if if_none_match is None:
        return False
    tags = [tag.strip() for tag in if_none_match.split(",")]
    return "*" in tags or etag in (tag.removeprefix("W/") for tag in tags)


def _file(name: str, request: Request) -> Response:
    asset = ASSETS.get(name)
    if asset is None:
        raise HTTPException(status_code=404, detail=f"No explorer file named {name!r}.")
    headers = {**HEADERS, "ETag": asset.etag}
    if _matches(request.headers.get("if-none-match"), asset.etag):
        return Response(status_code=304, headers=headers)
    return Response(asset.content, media_type=asset.media_type, headers=headers)


@router.get("/")
async def explorer_page(request: Request) -> Response:
    """The explorer: similarity and knowledge-tracing tabs over this server's API."""
    return _file("index.html", request)


@router.get("/explorer/{name:path}")
async def explorer_asset(name: str, request: Request) -> Response:
    """A script, style sheet or icon of the explorer page."""
    return _file(name, request)
