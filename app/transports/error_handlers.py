"""The one place that maps the service's errors to HTTP answers (`{"detail": ...}`; 422 in FastAPI's shape)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument as OrtInvalidArgument
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute, Match, Mount
from starlette.types import Scope

from app.core.errors import HTTP_METHODS, InvalidInput, ServiceError, body_invalid, ort_message
from app.core.logging import TracebackBudget, loggable_path, route_path
from app.core.responses import JsonResponse
from app.students.io import StoreBusy
from app.students.store import StoreError, StoreUnavailable
from app.transports.oip_errors import is_protocol_path

logger = logging.getLogger("mnemo.errors")
STORE_RETRY = {"Retry-After": "1"}
store_outages = TracebackBudget(10.0)  # an unavailable store is logged, with its location, once per 10 s per failure


def allowed_methods(routes: Sequence[BaseRoute], scope: Scope) -> str | None:
    """The 405's `Allow`: every method a route takes on the path (Starlette's: the first route's), HEAD with GET."""
    routes = [route for route in routes if not isinstance(route, Mount)]
    allowed = {m for m in HTTP_METHODS if any(r.matches({**scope, "method": m})[0] == Match.FULL for r in routes)}
    allowed |= {"HEAD"} if "GET" in allowed else set()
    return ", ".join(method for method in HTTP_METHODS if method in allowed) or None


def install_error_handlers(app: FastAPI) -> None:
    """Register the mapping from exceptions to responses."""

    async def http_error(request: Request, error: HTTPException | ServiceError) -> JsonResponse:
        headers = error.headers
        if error.status_code == 405 and (allowed := allowed_methods(request.app.router.routes, request.scope)):
            headers = {**(headers or {}), "Allow": allowed}  # else Starlette's own (a mounted app's 405)
        return JsonResponse({"detail": error.detail}, error.status_code, headers=headers)

    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(ServiceError, http_error)

    @app.exception_handler(StoreError)
    async def store_error(request: Request, error: StoreError) -> JsonResponse:
        if isinstance(error, StoreBusy):
            request.app.state.metrics.refused("store_busy")
            return JsonResponse({"detail": error.detail}, 429, headers=STORE_RETRY)
        if not isinstance(error, StoreUnavailable):
            return JsonResponse({"detail": error.detail}, error.status_code)
        request.app.state.metrics.refused("store_unavailable")
        log_now, unlogged = store_outages.admit(error)
        if log_now:
            more = f" ({unlogged} more since the last line)" if unlogged else ""
            logger.warning("student state store unavailable: %s%s", error.internal, more)
        affected = f"The student state store is unavailable ({error.detail}); only the /students endpoints are affected"
        if error.until_restart:  # a retry cannot help: no Retry-After
            return JsonResponse({"detail": f"{affected}, until the service is restarted."}, 503)
        return JsonResponse({"detail": f"{affected}, retry later."}, 503, headers=STORE_RETRY)

    @app.exception_handler(InvalidInput)
    async def invalid_input(request: Request, error: InvalidInput) -> JsonResponse:
        return JsonResponse(error.payload(), 422)

    @app.exception_handler(RequestValidationError)
    async def request_validation(request: Request, error: RequestValidationError) -> JsonResponse:
        errors = error.errors()
        return JsonResponse(InvalidInput.from_pydantic(errors, len(errors)).payload(), 422)

    @app.exception_handler(ValidationError)
    async def invalid_body(request: Request, error: ValidationError) -> JsonResponse:
        return JsonResponse(body_invalid(error).payload(), 422)

    @app.exception_handler(OrtInvalidArgument)
    async def rejected_by_model(request: Request, error: OrtInvalidArgument) -> JsonResponse:
        logger.warning("model rejected the input on %s %s: %s", request.method, loggable_path(request.scope), error)
        if is_protocol_path(route_path(request.scope)):  # the protocol's 400, shaped by oip_errors.py
            return JsonResponse({"detail": ort_message(error)}, 400)
        return JsonResponse(InvalidInput(("body",), ort_message(error)).payload(), 422)
