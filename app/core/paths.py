"""The request path as it may be written to logs: the route template, never client text such as student ids."""

from __future__ import annotations

from urllib.parse import quote

from starlette.types import Scope

MAX_UNMATCHED_PATH = 64
# Unmatched paths under these prefixes may still carry an id (e.g. /students/<id>/typo): cut after the prefix.
ID_BEARING_PREFIXES = ("/students/",)


def loggable_path(scope: Scope) -> str:
    """The matched route's template (`/students/{student_id}`); for an unmatched request the path percent-encoded
    (one field of the access line: no space, control or non-ASCII character), truncated, and cut right after any
    prefix whose next segment is an id."""
    template = getattr(scope.get("route"), "path", None)
    if template:
        return template
    path: str = scope.get("path", "")
    for prefix in ID_BEARING_PREFIXES:
        if path.startswith(prefix):
            return prefix + "…"
    path = quote(path, safe="/:@!$&'()*+,;=")  # RFC 3986's characters of a path stay as they are
    return path if len(path) <= MAX_UNMATCHED_PATH else path[:MAX_UNMATCHED_PATH] + "…"
