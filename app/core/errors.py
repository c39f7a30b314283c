"""The errors answered to clients: a status, one sentence never echoing the bad value; any other is a bug (500)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import TypeVar

from pydantic import ValidationError

LOCATION_ROOTS = ("body", "query", "path", "header")
MAX_LISTED_ERRORS = 20
HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
INTERNAL_ERROR = {"detail": "Internal error; it has been logged."}
T = TypeVar("T")


class ServiceError(Exception):
    """An error with a status and one clear sentence for the client."""

    status_code = 500
    headers: Mapping[str, str] | None = None

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class UnknownModel(ServiceError):
    status_code = 404  # no model of that name (and task); the detail lists the names that exist


class ModelNotReady(ServiceError):
    status_code = 503  # configured but not loaded (a missing or tampered file with MNEMO_ON_MODEL_ERROR=skip)


class Overloaded(ServiceError):
    status_code = 429  # the model's queue is full: rejected at once, before any work
    headers = MappingProxyType({"Retry-After": "1"})


class DeadlineExceeded(ServiceError):
    status_code = 504  # not finished within MNEMO_REQUEST_TIMEOUT_S; its unstarted work was dropped


def body_too_large_detail(max_bytes: int) -> str:
    """The 413 sentence for a body over MNEMO_MAX_BODY_BYTES."""
    return f"Request body is larger than the limit of {max_bytes} bytes (MNEMO_MAX_BODY_BYTES)."


class InvalidInput(Exception):
    """A broken rule: 422 in FastAPI's shape. `field` is a body field (`"sentence_a"`) or a location such as
    `("body", "interactions", 3, "question")` (relative to the body unless it starts with body/query/path/header)."""

    def __init__(self, field: str | Sequence[str | int], message: str) -> None:
        super().__init__(message)
        location = (field,) if isinstance(field, str) else tuple(field)
        if not location or location[0] not in LOCATION_ROOTS:
            location = ("body", *location)
        self.location: tuple[str | int, ...] = location
        self.message = message
        self.listed: list[InvalidInput] = [self]  # the rules listed in the 422 (see `joined`), this one first
        self.count = 1  # the rules broken, listed or not

    @classmethod
    def joined(cls, errors: Sequence[InvalidInput], count: int | None = None) -> InvalidInput:
        """One 422 for several broken rules: the first `MAX_LISTED_ERRORS` listed, `count` (default: all) counted."""
        first = errors[0]
        first.listed = [listed for error in errors for listed in error.listed][:MAX_LISTED_ERRORS]
        first.count = sum(error.count for error in errors) if count is None else count
        return first

    def detail(self) -> list[dict]:
        """The `detail` list of FastAPI's 422 body."""
        return [{"loc": list(error.location), "msg": error.message, "type": "value_error"} for error in self.listed]


def each_checked(checks: Iterable[Callable[[], T]]) -> list[T]:
    """Every check's result; when some raise InvalidInput, one 422 listing all of them (not only the first)."""
    results, errors = [], []
    for check in checks:
        try:
            results.append(check())
        except InvalidInput as error:
            errors.append(error)
    if errors:
        raise InvalidInput.joined(errors)
    return results


class InvalidBody(Exception):
    """A body that failed validation, with its bounded 422 payload already built (off the event loop)."""

    def __init__(self, payload: dict) -> None:
        super().__init__("invalid body")
        self.payload = payload


def validation_detail(errors: Sequence[dict], prefix: tuple[str, ...] = ()) -> dict:
    """A bounded, always-encodable 422 body: the first errors (location, message, type) and the count."""
    listed = [
        {
            "loc": [*prefix, *(part if isinstance(part, int) else printable(str(part)) for part in error["loc"])],
            "msg": printable(str(error["msg"])),
            "type": str(error["type"]),
        }
        for error in errors[:MAX_LISTED_ERRORS]
    ]
    return {"detail": listed, "error_count": len(errors)}


def printable(text: str, limit: int = 300) -> str:
    """Text safe to encode as UTF-8 JSON: no lone surrogates, bounded length."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")[:limit]


def body_errors(error: ValidationError) -> dict:
    """The bounded 422 payload of a request body's ValidationError (the first errors and their count)."""
    listed = error.errors(include_url=False, include_input=False, include_context=False)[:MAX_LISTED_ERRORS]
    return {**validation_detail(listed, ("body",)), "error_count": error.error_count()}


def ort_message(error: Exception) -> str:
    """onnxruntime's message without its status prefix and boilerplate, on one line."""
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", str(error).strip())
    text = text.replace("Please fix either the inputs/outputs or the model.", "")
    return " ".join(text.split())
