"""Request bodies as JSON: pydantic's fast parser, and a field-naming 422 where it only says "invalid JSON"
(a lone UTF-16 surrogate, a non-finite number), found by reading the body again with Python's `json`."""

from __future__ import annotations

import json
import math
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from app.core.errors import InvalidInput

Body = TypeVar("Body", bound=BaseModel)
Location = tuple[str | int, ...]


def parse_body(schema: type[Body], body: bytes) -> Body:
    """`schema` validated from the JSON `body`; raises ValidationError or InvalidInput (both 422)."""
    try:
        return schema.model_validate_json(body)
    except ValidationError as error:
        if any(problem["type"] == "json_invalid" for problem in error.errors(include_url=False, include_input=False)):
            located = locate_unrepresentable(body)
            if located is not None:
                raise located from None
        raise


def locate_unrepresentable(body: bytes) -> InvalidInput | None:
    """The first string with a lone surrogate or non-finite number in `body`, as a 422; None if there is none."""
    try:
        document = json.loads(body, parse_constant=lambda name: float(name.replace("Infinity", "inf")))
    except (ValueError, RecursionError):
        return None
    found = _first_problem(document, ("body",))
    if found is None:
        return None
    location, message = found
    return InvalidInput(location, message)


def _first_problem(value: Any, location: Location) -> tuple[Location, str] | None:
    """Depth-first, iterative (a deeply nested body cannot exhaust the stack)."""
    pending: list[tuple[Any, Location]] = [(value, location)]
    while pending:
        item, where = pending.pop()
        if isinstance(item, str) and not _valid_unicode(item):
            return where, "must be valid Unicode text (it holds a lone UTF-16 surrogate)"
        if isinstance(item, float) and not math.isfinite(item):
            return where, "must be a finite number (NaN, Infinity and overflowing numbers are not allowed)"
        if isinstance(item, dict):
            for key, child in reversed(item.items()):
                if not _valid_unicode(key):
                    return where, "field names must be valid Unicode text (one holds a lone UTF-16 surrogate)"
                pending.append((child, (*where, key)))
        elif isinstance(item, list):
            pending.extend((child, (*where, index)) for index, child in reversed(list(enumerate(item))))
    return None


def _valid_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
