"""GET /health, /ready, /models and /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

router = APIRouter(tags=["operations"])


@router.get("/health")
async def health() -> dict[str, str]:
    """200 while the process is up."""
    return {"status": "ok"}


@router.get("/ready")
async def ready(request: Request) -> JSONResponse:
    """200 when every configured model is loaded, verified and warmed; else 503 naming the others."""
    registry = getattr(request.app.state, "registry", None)
    if registry is None:
        return JSONResponse({"detail": "Models are still loading."}, status_code=503)
    not_ready = [name for name, model in registry.models.items() if not model.ready]
    if not_ready:
        return JSONResponse({"detail": f"Models not ready: {', '.join(not_ready)}."}, status_code=503)
    return JSONResponse({"status": "ready", "models": len(registry.models)})


@router.get("/models")
async def models(request: Request) -> JSONResponse:
    """Every configured model with its task, provider really in use, limits, metrics and metadata."""
    registry = getattr(request.app.state, "registry", None)
    if registry is None:
        return JSONResponse({"detail": "Models are still loading."}, status_code=503)
    return JSONResponse({"models": [model.public_info() for model in registry.models.values()]})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Prometheus text format."""
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
