"""Every error the service returns, and the one place that maps them to HTTP statuses.

- `ServiceError` subclasses carry a status and one clear sentence: `{"detail": "<sentence>"}`, plus
  headers where the status calls for them (429 and 503 say `Retry-After`).
- `InvalidInput` is a rule broken by a request body (schema or model-specific); it answers 422 in
  FastAPI's validation shape, at most `MAX_LISTED_ERRORS` entries and their total count (`each_checked`
  gathers the rules broken by every item of a request, not only the first), and never
  echoes the offending value back (it may not even be encodable: lone surrogates, NaN).
- onnxruntime's `InvalidArgument` (a feed the graph rejects) is an input problem: 422 as well.
- The student-state store's errors (`app.students.store.StoreError`) carry their own status: 503 with
  `Retry-After` when the database is unavailable, 429 with `Retry-After` when too many of its calls wait
  (`app.students.io.StoreBusy`: the store is slow, not down), 409 for a model-version mismatch or lost races.
- A method the path does not take: 405 whose `Allow` lists every method some route takes on that path
  (Starlette's names only the first route's: GET but not DELETE on /students/{student_id}).
- Anything else is a bug: answered 500 as a last resort by `CatchUnexpected` (app/frame/failures.py).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import TypeVar

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument as OrtInvalidArgument
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.routing import BaseRoute, Match, Mount
from starlette.types import Scope

from app.frame.failures import TracebackBudget
from app.frame.paths import loggable_path
from app.frame.responses import JsonResponse
from app.students.io import StoreBusy
from app.students.store import StoreError, StoreUnavailable

logger = logging.getLogger("mnemo.errors")
LOCATION_ROOTS = ("body", "query", "path", "header")
MAX_LISTED_ERRORS = 20
STORE_RETRY_AFTER_S = 1
STORE_LOG_EVERY_S = 10.0  # an unavailable store is logged (with its location) at most this often
HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
T = TypeVar("T")


store_outages = TracebackBudget(STORE_LOG_EVERY_S)  # one log line per distinct failure per window


class ServiceError(Exception):
    """An error with a status and one clear sentence for the client."""

    status_code = 500
    headers: Mapping[str, str] | None = None

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class UnknownModel(ServiceError):
    """No model of that name (and task); the detail lists the names that exist."""

    status_code = 404


class ModelNotReady(ServiceError):
    """The model is configured but not loaded (missing/tampered file with MNEMO_ON_MODEL_ERROR=skip)."""

    status_code = 503


class Overloaded(ServiceError):
    """The model's queue is full: rejected at once, before any work (429, Retry-After)."""

    status_code = 429
    headers = MappingProxyType({"Retry-After": "1"})


class DeadlineExceeded(ServiceError):
    """The request did not finish within MNEMO_REQUEST_TIMEOUT_S; its unstarted work was dropped."""

    status_code = 504


def body_too_large_detail(max_bytes: int) -> str:
    """The 413 sentence for a body over MNEMO_MAX_BODY_BYTES (used by the ASGI middleware)."""
    return f"Request body is larger than the limit of {max_bytes} bytes (MNEMO_MAX_BODY_BYTES)."


class InvalidInput(Exception):
    """A request that breaks a rule: 422 in FastAPI's shape.

    `field` is a body field name (`"sentence_a"`) or a full location (`("body", "interactions", 3, "question")`);
    a location that does not start with body/query/path/header is taken as relative to the body.
    """

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
            "loc": [*prefix, *(part if isinstance(part, int) else _printable(str(part)) for part in error["loc"])],
            "msg": _printable(str(error["msg"])),
            "type": str(error["type"]),
        }
        for error in errors[:MAX_LISTED_ERRORS]
    ]
    return {"detail": listed, "error_count": len(errors)}


def _printable(text: str, limit: int = 300) -> str:
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


def allowed_methods(routes: Sequence[BaseRoute], scope: Scope) -> str | None:
    """The `Allow` header for the scope's path: every method that some route takes there (mounts left out),
    and HEAD wherever GET is (HeadAsGet answers it, though FastAPI's GET routes do not declare it)."""
    allowed = {
        method
        for method in HTTP_METHODS
        if any(
            not isinstance(route, Mount) and route.matches({**scope, "method": method})[0] == Match.FULL
            for route in routes
        )
    }
    if "GET" in allowed:
        allowed.add("HEAD")
    return ", ".join(method for method in HTTP_METHODS if method in allowed) or None


def install_error_handlers(app: FastAPI) -> None:
    """Register the mapping from exceptions to responses."""

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> Response:
        allowed = allowed_methods(request.app.router.routes, request.scope) if error.status_code == 405 else None
        if allowed:  # else Starlette's own (a mounted app's 405)
            error.headers = {**(error.headers or {}), "Allow": allowed}
        return await http_exception_handler(request, error)

    @app.exception_handler(ServiceError)
    async def service_error(request: Request, error: ServiceError) -> JsonResponse:
        return JsonResponse({"detail": error.detail}, error.status_code, headers=error.headers)

    @app.exception_handler(StoreError)
    async def store_error(request: Request, error: StoreError) -> JsonResponse:
        if isinstance(error, StoreBusy):
            request.app.state.metrics.refused("store_busy")
            return JsonResponse({"detail": error.detail}, 429, headers={"Retry-After": str(STORE_RETRY_AFTER_S)})
        if isinstance(error, StoreUnavailable):
            request.app.state.metrics.refused("store_unavailable")
            log_now, unlogged = store_outages.admit(error)
            if log_now:
                more = f" ({unlogged} more since the last line)" if unlogged else ""
                logger.warning("student state store unavailable: %s%s", error.internal, more)
            affected = (
                f"The student state store is unavailable ({error.detail}); only the /students endpoints are affected"
            )
            if error.until_restart:  # a retry cannot help: no Retry-After
                return JsonResponse({"detail": f"{affected}, until the service is restarted."}, 503)
            headers = {"Retry-After": str(STORE_RETRY_AFTER_S)}
            return JsonResponse({"detail": f"{affected}, retry later."}, 503, headers=headers)
        return JsonResponse({"detail": error.detail}, error.status_code)

    @app.exception_handler(InvalidInput)
    async def invalid_input(request: Request, error: InvalidInput) -> JsonResponse:
        return JsonResponse({"detail": error.detail(), "error_count": error.count}, 422)

    @app.exception_handler(RequestValidationError)
    async def request_validation(request: Request, error: RequestValidationError) -> JsonResponse:
        return JsonResponse(validation_detail(list(error.errors())), 422)

    @app.exception_handler(ValidationError)
    async def body_validation(request: Request, error: ValidationError) -> JsonResponse:
        return JsonResponse(body_errors(error), 422)

    @app.exception_handler(InvalidBody)
    async def invalid_body(request: Request, error: InvalidBody) -> JsonResponse:
        return JsonResponse(error.payload, 422)

    @app.exception_handler(OrtInvalidArgument)
    async def rejected_by_model(request: Request, error: OrtInvalidArgument) -> JsonResponse:
        logger.warning("model rejected the input on %s %s: %s", request.method, loggable_path(request.scope), error)
        message = f"The model rejected the input: {ort_message(error)}"
        return JsonResponse({"detail": InvalidInput(("body",), message).detail(), "error_count": 1}, 422)
