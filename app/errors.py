"""Every error the service returns, and the one place that maps them to HTTP statuses.

- `ServiceError` subclasses carry a status and one clear sentence: `{"detail": "<sentence>"}`.
- `InvalidInput` is a model-specific rule broken by a request that passed schema validation; it answers
  422 in FastAPI's own validation shape, so clients handle one format.
- onnxruntime's `InvalidArgument` (a feed the graph rejects: shape, rank, dtype, index range) is an input
  problem, so it is a 422 as well; it is logged as a warning because a router should have caught it first.
- Anything else is a bug: it is logged with its traceback and answered 500 as a last resort.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument as OrtInvalidArgument

logger = logging.getLogger("mnemo.errors")
LOCATION_ROOTS = ("body", "query", "path", "header")


class ServiceError(Exception):
    """An error with a status and one clear sentence for the client."""

    status_code = 500

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class UnknownModel(ServiceError):
    """No model of that name (and task); the detail lists the names that exist."""

    status_code = 404


class ModelNotReady(ServiceError):
    """The model is configured but not loaded (missing/tampered file with MNEMO_ON_MODEL_ERROR=skip)."""

    status_code = 503


def body_too_large_detail(max_bytes: int) -> str:
    """The 413 sentence for a body over MNEMO_MAX_BODY_BYTES (used by the ASGI middleware)."""
    return f"Request body is larger than the limit of {max_bytes} bytes (MNEMO_MAX_BODY_BYTES)."


class InvalidInput(Exception):
    """A request that passed schema validation but breaks a model-specific rule: 422, FastAPI's shape.

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

    def detail(self) -> list[dict]:
        """The `detail` list of FastAPI's 422 body."""
        return [{"loc": list(self.location), "msg": self.message, "type": "value_error"}]


def ort_message(error: Exception) -> str:
    """onnxruntime's message without its status prefix and boilerplate, on one line."""
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", str(error).strip())
    text = text.replace("Please fix either the inputs/outputs or the model.", "")
    return " ".join(text.split())


def install_error_handlers(app: FastAPI) -> None:
    """Register the mapping from exceptions to responses."""

    @app.exception_handler(ServiceError)
    async def service_error(request: Request, error: ServiceError) -> JSONResponse:
        return JSONResponse({"detail": error.detail}, status_code=error.status_code)

    @app.exception_handler(InvalidInput)
    async def invalid_input(request: Request, error: InvalidInput) -> JSONResponse:
        return JSONResponse({"detail": error.detail()}, status_code=422)

    @app.exception_handler(OrtInvalidArgument)
    async def rejected_by_model(request: Request, error: OrtInvalidArgument) -> JSONResponse:
        logger.warning("model rejected the input on %s %s: %s", request.method, request.url.path, error)
        message = f"The model rejected the input: {ort_message(error)}"
        return JSONResponse({"detail": InvalidInput(("body",), message).detail()}, status_code=422)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        logger.exception("unexpected error on %s %s", request.method, request.url.path)
        return JSONResponse({"detail": "Internal error; it has been logged."}, status_code=500)
