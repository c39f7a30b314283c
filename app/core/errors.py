"""The errors answered to clients: a status, one sentence never echoing the bad value; any other is a bug (500)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import TypeVar

LOCATION_ROOTS = ("body", "query", "path", "header", "cookie")
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


class ClientGone(ServiceError):
    status_code = 499  # the client disconnected: nobody reads this answer, its access line and metrics say 499


class InvalidInput(Exception):
    """A broken rule: 422 in FastAPI's shape. `field` is a body field (`"sentence_a"`) or a location such as
    `("body", "interactions", 3, "question")` (relative to the body unless it starts with body/query/path/header)."""

    def __init__(self, field: str | Sequence[str | int], message: str, kind: str = "value_error") -> None:
        super().__init__(message)
        location = (field,) if isinstance(field, str) else tuple(field)
        self.location = location if location and location[0] in LOCATION_ROOTS else ("body", *location)
        self.message, self.kind = message, kind
        self.listed: list[InvalidInput] = [self]  # the rules listed in the 422 (see `joined`), this one first
        self.count = 1  # the rules broken, listed or not

    @classmethod
    def joined(cls, errors: Sequence[InvalidInput], count: int | None = None) -> InvalidInput:
        """One 422 for several broken rules: the first `MAX_LISTED_ERRORS` listed, `count` (default: all) counted."""
        first = errors[0]
        first.listed = [listed for error in errors for listed in error.listed][:MAX_LISTED_ERRORS]
        first.count = sum(error.count for error in errors) if count is None else count
        return first

    @classmethod
    def from_pydantic(cls, errors: Sequence[dict], count: int, root: tuple[str, ...] = ()) -> InvalidInput:
        """Pydantic's (or FastAPI's) `errors` as one 422: locations under `root`, text made encodable and bounded."""
        listed = []
        for error in errors[:MAX_LISTED_ERRORS]:
            location = (*root, *(part if isinstance(part, int) else printable(str(part)) for part in error["loc"]))
            listed.append(cls(location, printable(str(error["msg"])), str(error["type"])))
        return cls.joined(listed, count)

    def payload(self) -> dict:
        """FastAPI's 422 body: the rules listed, and `error_count`, how many were broken in all."""
        detail = [{"loc": list(error.location), "msg": error.message, "type": error.kind} for error in self.listed]
        return {"detail": detail, "error_count": self.count}


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


def printable(text: str, limit: int | None = 300) -> str:
    """Text safe to show, cut at `limit`: what is not printable (controls, bidi overrides, lone surrogates) escaped."""
    text = text[:limit]
    return text if text.isprintable() else "".join(char if char.isprintable() else ascii(char)[1:-1] for char in text)


def ort_message(error: Exception) -> str:
    """What the client is told of onnxruntime's rejection: its message without the status prefix and boilerplate."""
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", str(error).strip())
    text = text.replace("Please fix either the inputs/outputs or the model.", "")
    return f"The model rejected the input: {' '.join(text.split())}"
