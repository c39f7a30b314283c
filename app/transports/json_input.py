"""Request bodies as JSON: pydantic's fast parser, and a field-naming 422 for what it only calls invalid JSON.

pydantic's JSON parser refuses a lone UTF-16 surrogate escape (`"\\ud800"`) as "invalid JSON" at a
column, without naming the field. When it does, the body is read again with Python's `json` module,
which accepts those escapes (and `NaN`, `Infinity`, numbers that overflow to infinity), to find the
first string holding invalid Unicode or the first non-finite number and name its field. Non-finite
numbers that pydantic's parser does accept are refused by the schemas' strict types (every number in
a request is an integer or a boolean), with the field named. Valid bodies never take this path.
"""

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
