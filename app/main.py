"""The FastAPI application: `create_app(settings)` and the module-level `app` for `uvicorn app.main:app`."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from app.errors import install_error_handlers
from app.explorer.router import router as explorer_router
from app.logging_config import configure_logging
from app.metrics import Metrics
from app.middleware import BodySizeLimit, RequestContext
from app.registry import ModelRegistry, Preparer
from app.routers import knowledge_trace, operations, similarity
from app.settings import Settings

logger = logging.getLogger("mnemo")
# Each task router module exposes `router` (an APIRouter), `TASK` and `prepare(model, settings) -> None`,
# which the registry runs at startup for every model of that task (see app/registry.py).
TASK_ROUTERS = (similarity, knowledge_trace)
DESCRIPTION = """Memory-augmented neural models behind one API:

* **POST /similarity**, **/similarity/batch**: LSTM_RMC (Relational Memory Core) sentence-pair model
  trained on SICK: relatedness 1..5, entailment probabilities, attention maps.
* **POST /knowledge-trace**: DKVMN knowledge tracing: per-step and next-question correctness
  probabilities, per-concept mastery and the correlation-weight attention.

Models run in ONNX Runtime; `GET /models` lists them with the execution provider in use."""


def create_app(settings: Settings | None = None, preparers: dict[str, Preparer] | None = None) -> FastAPI:
    """Build the app; models are loaded, verified, warmed and prepared in the lifespan, before it serves.

    `preparers` replaces the task routers' own (`{TASK: prepare}`); tests of the frame pass `{}` or
    their own to serve toy models under a task name.
    """
    settings = settings or Settings()
    configure_logging(settings.log_level, settings.log_format)
    metrics = Metrics()
    preparers = {router.TASK: router.prepare for router in TASK_ROUTERS} if preparers is None else preparers

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        registry = ModelRegistry(settings, preparers, metrics)
        try:
            await run_in_threadpool(registry.load)
        except Exception as error:
            logger.error("startup failed: %s", error)
            raise
        app.state.registry = registry
        logger.info("ready: %d model(s) on %s", len(registry.models), registry.provider)
        yield

    app = FastAPI(title="mnemo", version="1.0.0", description=DESCRIPTION, lifespan=lifespan)
    app.state.settings = settings
    app.state.metrics = metrics
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(RequestContext, metrics=metrics)
    app.include_router(operations.router)
    app.include_router(explorer_router)
    for router in TASK_ROUTERS:
        app.include_router(router.router)
    return app


app = create_app()
