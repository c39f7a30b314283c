"""Every error the service returns, and the one place that maps them to HTTP statuses."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

logger = logging.getLogger("mnemo.errors")


class ServiceError(Exception):
    """An error with a status and one clear sentence for the client."""

    status_code = 500

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class UnknownModel(ServiceError):
    status_code = 404


class ModelNotReady(ServiceError):
    status_code = 503


class InvalidInput(Exception):
    """A request that passed schema validation but breaks a model-specific rule (422, FastAPI's shape)."""

    def __init__(self, location: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.location = location
        self.message = message


def install_error_handlers(app: FastAPI) -> None:
    """Register the mapping from exceptions to responses."""

    @app.exception_handler(ServiceError)
    async def service_error(request: Request, error: ServiceError) -> JSONResponse:
        return JSONResponse({"detail": error.detail}, status_code=error.status_code)

    @app.exception_handler(InvalidInput)
    async def invalid_input(request: Request, error: InvalidInput) -> JSONResponse:
        detail = [{"loc": list(error.location), "msg": error.message, "type": "value_error"}]
        return JSONResponse({"detail": detail}, status_code=422)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        logger.exception("unexpected error on %s %s", request.method, request.url.path)
        return JSONResponse({"detail": "Internal error; it has been logged."}, status_code=500)
