"""The one place that maps the service's errors to HTTP answers: `{"detail": ...}` (422 in FastAPI's shape), under /v2
the Open Inference Protocol's `{"error": ...}`, the only field clients such as tritonclient read."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument as OrtInvalidArgument
from starlette.exceptions import HTTPException
from starlette.routing import Match, Mount
from starlette.types import Receive, Scope, Send

from app.core.errors import HTTP_METHODS, InvalidInput, Overloaded, ServiceError, ort_message
from app.core.logging import TracebackBudget, loggable_path
from app.core.responses import JsonResponse
from app.students.io import StoreBusy
from app.students.store import StoreUnavailable

logger = logging.getLogger("mnemo.errors")
store_outages = TracebackBudget(10.0)  # an unavailable store is logged, with its location, once per 10 s per failure
EXCHANGE = "mnemo.exchange"  # the request edge's record of the request, in the app's scope (middleware.py)
PARSER_ANSWERED = "mnemo.parser_answered"  # the id of the 400 h11 answered for the request's body (header_deadline.py)


def is_protocol_path(path: str) -> bool:
    return path == "/v2" or path.startswith("/v2/")


def error_answer(scope: Scope, status: int, detail: Any, headers: Mapping[str, str] | None = None) -> JsonResponse:
    """An error in its path's shape: `{"error": "<sentence>"}` under /v2, else `{"detail": ...}`."""
    payload = {"error": str(detail)} if is_protocol_path(scope[EXCHANGE].path) else {"detail": detail}
    return JsonResponse(payload, status, headers=headers)


class Refused(HTTPException):
    """A refusal of the request edge or the CORS policy: an ASGI app answering it in its path's shape, or raised while
    the app reads the body and answered by `http_error` (an HTTPException: FastAPI's body parsing lets it through)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await error_answer(scope, self.status_code, self.detail, self.headers)(scope, receive, send)


def install_error_handlers(app: FastAPI) -> None:
    """Register the mapping from exceptions to responses."""

    async def http_error(request: Request, error: HTTPException | ServiceError) -> JsonResponse:
        headers, scope = error.headers, request.scope
        if error.status_code == 405:  # `Allow`: every method a route takes on the path (Starlette's: the first's)
            routes = [r for r in request.app.router.routes if not isinstance(r, Mount)]
            takes = {m for m in HTTP_METHODS for r in routes if r.matches({**scope, "method": m})[0] == Match.FULL}
            if takes:  # HEAD with GET; none: Starlette's own (a mounted app's 405)
                allow = ", ".join(m for m in HTTP_METHODS if m in takes or (m == "HEAD" and "GET" in takes))
                headers = {**(headers or {}), "Allow": allow}
        return error_answer(scope, error.status_code, error.detail, headers)

    for kind in (HTTPException, ServiceError):
        app.add_exception_handler(kind, http_error)

    async def store_refused(request: Request, error: StoreBusy | StoreUnavailable) -> JsonResponse:
        busy = isinstance(error, StoreBusy)  # any other StoreError is a ServiceError: `http_error` answers it
        request.app.state.metrics.refused("store_busy" if busy else "store_unavailable")
        if busy:
            return JsonResponse({"detail": error.detail}, 429, headers=Overloaded.headers)
        log_now, unlogged = store_outages.admit(error)
        if log_now:
            more = f" ({unlogged} more since the last line)" if unlogged else ""
            logger.warning("student state store unavailable: %s%s", error.internal, more)
        affected = f"The student state store is unavailable ({error.detail}); only the /students endpoints are affected"
        if error.until_restart:  # a retry cannot help: no Retry-After
            return JsonResponse({"detail": f"{affected}, until the service is restarted."}, 503)
        return JsonResponse({"detail": f"{affected}, retry later."}, 503, headers=Overloaded.headers)

    for kind in (StoreBusy, StoreUnavailable):
        app.add_exception_handler(kind, store_refused)

    async def invalid(request: Request, error: InvalidInput | RequestValidationError) -> JsonResponse:
        if isinstance(error, RequestValidationError):
            error = InvalidInput.from_pydantic(errors := error.errors(), len(errors))
        return JsonResponse(error.payload(), 422)

    for kind in (InvalidInput, RequestValidationError):
        app.add_exception_handler(kind, invalid)

    @app.exception_handler(OrtInvalidArgument)
    async def rejected_by_model(request: Request, error: OrtInvalidArgument) -> JsonResponse:
        logger.warning("model rejected the input on %s %s: %s", request.method, loggable_path(request.scope), error)
        if is_protocol_path(request.scope[EXCHANGE].path):  # the protocol's 400
            return error_answer(request.scope, 400, ort_message(error))
        return JsonResponse(InvalidInput(("body",), ort_message(error)).payload(), 422)
