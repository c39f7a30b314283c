"""The FastAPI application, `create_app(settings, tasks)`; `app` for `uvicorn app.main:app` warns what it lacks."""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from importlib.metadata import PackageNotFoundError, version

from fastapi import FastAPI
from fastapi.routing import APIRoute

from app.core.drain import Drain
from app.core.logging import configure_logging, write_out_logs
from app.core.loop_lag import LoopLag
from app.core.metrics import Metrics
from app.core.settings import Settings
from app.explorer.router import router as explorer_router
from app.runtime.model import Task
from app.runtime.offload import offload
from app.runtime.registry import ModelLoadError, ModelRegistry
from app.runtime.sessions import ProviderUnavailable
from app.students.io import StoreHolder
from app.tasks import TASKS
from app.transports import docs, oip, operations, students
from app.transports.contract import document_contract
from app.transports.error_handlers import install_error_handlers
from app.transports.grpc import serve_grpc
from app.transports.http import BODY_SCHEMAS, task_router
from app.transports.middleware import ServiceApp
from app.transports.probe_server import probe_process

logger = logging.getLogger("mnemo")
UNPROTECTED = (
    "not started by `python -m app`: this server has none of its limits (worker heartbeat, header size and time, "
    "connection caps, drain on SIGTERM); serve with `python -m app` behind nginx (deploy/nginx/nginx.conf)"
)
DESCRIPTION = "Memory-augmented neural models on ONNX Runtime: LSTM_RMC sentence similarity, DKVMN knowledge tracing."

try:
    VERSION = version("mnemo")
except PackageNotFoundError:  # run from a checkout that was never installed
    VERSION = "0.0.0"


def create_app(
    settings: Settings | None = None, tasks: Mapping[str, Task] | None = None, identity: dict[str, str] | None = None
) -> FastAPI:
    """The app; its models are loaded, verified and warmed in the lifespan. `tasks` replaces `app.tasks.TASKS`. With
    `identity` (Ray Serve's replica) or several workers, each answer says which process gave it (`X-Mnemo-Pid`)."""
    settings = settings or Settings()
    tasks = TASKS if tasks is None else tasks
    configure_logging(settings.log_level, settings.log_format)
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        """The probe process (if MNEMO_PROBE_PORT is set), models, student store, engine and gRPC while serving."""
        async with AsyncExitStack() as stack:
            stack.callback(write_out_logs)
            stack.callback(asyncio.create_task(app.state.loop_lag.sample(), name="loop-lag").cancel)
            if settings.probe_port is not None:
                readiness = functools.partial(operations.readiness, app.state)
                push = await stack.enter_async_context(probe_process(settings.host, settings.probe_port, readiness))
                app.state.drain.on_begin.append(push)
                app.state.loop_lag.on_sample = push
            registry = ModelRegistry(settings, tasks, metrics)
            try:
                await offload(registry.load)
            except Exception as error:
                if isinstance(error, ModelLoadError | ProviderUnavailable):  # python -m app: this one line (server.py)
                    app.state.startup_error = str(error)
                logger.error("startup failed: %s", error)
                raise
            app.state.students = StoreHolder(settings.state_url)  # per-student state (/students endpoints)
            stack.push_async_callback(offload, app.state.students.close)
            await offload(app.state.students.open)
            await stack.enter_async_context(registry.serve(alone=app.state.drain.alone))
            app.state.registry = registry
            metrics.build_info.labels(app.version).set(1)
            for name, model in registry.models.items():
                metrics.model_info.labels(name, model.entry.version, model.entry.sha256).set(1)
            logger.info("ready: %d model(s) on %s", len(registry.models), ", ".join(registry.providers))
            logger.info(app.state.api_keys.summary())
            if settings.grpc_port is not None:  # its calls drained before the engine
                await stack.enter_async_context(serve_grpc(app))
            gc.freeze()  # startup's objects: a full collection (tens of ms) walks only what comes after
            stack.callback(gc.unfreeze)  # at shutdown: an app dropped in this process (tests, Ray) is collected
            yield

    app = ServiceApp(
        title="mnemo",
        version=VERSION,
        description=DESCRIPTION,
        lifespan=lifespan,
        redirect_slashes=False,  # a slash redirect would echo the client's Host header in Location
        docs_url=None,  # served with local assets (app/transports/docs.py)
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.drain = Drain()
    app.state.connections = ()  # the server's open connections (app/server.py sets uvicorn's), counted by the edge
    app.state.startup_error = None  # why the models could not be loaded
    app.state.loop_lag = LoopLag(metrics.loop_lag)  # read by the deadlines (app/transports/http.py)
    app.state.reserving = {e.path: task.name for task in tasks.values() for e in task.endpoints if e.reserve}
    install_error_handlers(app)
    routers = (operations.router, explorer_router, task_router(tasks.values()), students.router, oip.router)
    for router in routers:
        app.include_router(router)
    docs.install(app)
    routes = {(m, r.path): r for router in routers for r in router.routes if isinstance(r, APIRoute) for m in r.methods}
    keys = {("POST", e.path) for task in tasks.values() for e in task.endpoints} | {("GET", "/health")}
    direct = {key: routes[key] for key in keys}
    # each request's id, access line, HEAD, limits, gates and 500; the `direct` routes skip FastAPI's router
    app.add_edge(direct, identity)

    def openapi() -> dict:
        if app.openapi_schema is None:  # FastAPI's schema, with the contract the routes do not declare
            app.openapi_schema = document_contract(FastAPI.openapi(app), app.state.api_keys, BODY_SCHEMAS.values())
        return app.openapi_schema

    app.openapi = openapi
    return app


def __getattr__(name: str) -> FastAPI:
    """`app` for `uvicorn app.main:app`, built when first read (a worker importing `create_app` reads no variable)."""
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()["app"] = application = create_app()
    logger.warning(UNPROTECTED)
    return application
