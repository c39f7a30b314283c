"""GET /health, /ready, /models and /metrics (HEAD as GET: the request edge, app/transports/middleware.py)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.datastructures import State

from app.core.responses import JsonResponse
from app.transports.contract import Health, ModelList, Readiness

router = APIRouter(tags=["operations"])


@router.get("/health", operation_id="health", response_model=Health)
async def health(request: Request) -> JsonResponse:
    """200 while the process is up (also while draining: it is alive, just not ready); called directly by the edge."""
    return JsonResponse({"status": "ok"})


@router.get("/ready", operation_id="ready", response_model=Readiness)
async def ready(request: Request) -> JsonResponse:
    """200 when every configured model is loaded, verified and warmed; 503 while loading or draining."""
    status, payload = readiness(request.app.state)
    return JsonResponse(payload, status)


def readiness(state: State) -> tuple[int, dict]:
    """The /ready answer (status, body) from the app's state; also called from the probe listener's thread."""
    if state.drain.draining:
        return 503, {"detail": "The server is shutting down."}
    if (registry := getattr(state, "registry", None)) is None:
        return 503, {"detail": "Models are still loading."}
    if not_ready := [name for name, model in registry.models.items() if not model.ready]:
        return 503, {"detail": f"Models not ready: {', '.join(not_ready)}."}
    return 200, {"status": "ready", "models": len(registry.models)}


@router.get("/models", operation_id="list_models", response_model=ModelList)
async def models(request: Request) -> JsonResponse:
    """Every configured model with its task, provider really in use, limits, batching, metrics and metadata."""
    if (registry := getattr(request.app.state, "registry", None)) is None:
        return JsonResponse({"detail": "Models are still loading."}, 503)
    listed = [model.public_info(registry.tasks.get(model.task)) for model in registry.models.values()]
    return JsonResponse({"models": listed})


@router.get("/metrics", operation_id="metrics", response_class=PlainTextResponse)
async def metrics(request: Request) -> Response:
    """Prometheus text format, rendered off the event loop (concurrent scrapes share a render)."""
    return Response(await request.app.state.metrics.scrape(), media_type=CONTENT_TYPE_LATEST)
