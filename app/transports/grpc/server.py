"""The gRPC server, on the HTTP app's event loop in its lifespan (MNEMO_GRPC_PORT; SO_REUSEPORT across workers).

Messages are bounded by MNEMO_MAX_BODY_BYTES and calls in flight by MNEMO_MAX_CONNECTIONS (past it grpc answers
RESOURCE_EXHAUSTED at once); on shutdown calls in flight get MNEMO_DRAIN_S, before the engine stops. It also serves
the standard `grpc.health.v1.Health` (Kubernetes gRPC probes, Envoy, grpc_health_probe).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import grpc
from fastapi import FastAPI
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from starlette.datastructures import State
from tritonclient.grpc import service_pb2, service_pb2_grpc

from app.transports.grpc.servicer import InferenceServicer
from app.transports.oip.inference import server_ready

logger = logging.getLogger("mnemo.grpc")
INFERENCE_SERVICE = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
INFER_METHOD = f"/{INFERENCE_SERVICE}/ModelInfer"


class DecodedByTheServicer(grpc.aio.ServerInterceptor):
    """Hands ModelInfer's message to `InferenceServicer.ModelInferBytes` as bytes: it decodes them itself."""

    def __init__(self, servicer: InferenceServicer) -> None:
        self.servicer = servicer

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if details.method != INFER_METHOD or handler is None:
            return handler
        return grpc.unary_unary_rpc_method_handler(
            self.servicer.ModelInferBytes, response_serializer=handler.response_serializer
        )


async def set_health(servicer: health.aio.HealthServicer, state: State) -> None:
    """SERVING for "" and the inference service when every model is ready (as `/ready`), else NOT_SERVING.
    Once the drain begins `enter_graceful_shutdown` makes both NOT_SERVING for good (later `set`s are ignored)."""
    ready = server_ready(state)
    status = health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
    for service in ("", INFERENCE_SERVICE):
        await servicer.set(service, status)


@asynccontextmanager
async def serve_grpc(app: FastAPI) -> AsyncIterator[None]:
    """Serve the Open Inference Protocol over gRPC on MNEMO_GRPC_PORT while the block runs (nothing when unset)."""
    settings = app.state.settings
    if settings.grpc_port is None:
        yield
        return
    servicer = InferenceServicer(app)
    server = grpc.aio.server(
        interceptors=[DecodedByTheServicer(servicer)],
        maximum_concurrent_rpcs=settings.max_connections,  # as REST's connections bound its requests in flight
        options=[
            ("grpc.max_receive_message_length", settings.max_body_bytes),
            ("grpc.so_reuseport", int(settings.workers > 1)),
        ],
    )
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    health_servicer = health.aio.HealthServicer()  # open to all, as the probe port is
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    loop = asyncio.get_running_loop()

    def not_serving() -> None:  # called in the signal handler that begins the drain
        asyncio.run_coroutine_threadsafe(health_servicer.enter_graceful_shutdown(), loop)

    app.state.drain.on_begin.append(not_serving)  # before the state is read: a drain beginning now is not missed
    try:
        await set_health(health_servicer, app.state)
        host = f"[{settings.host}]" if ":" in settings.host else settings.host
        try:
            server.add_insecure_port(f"{host}:{settings.grpc_port}")
        except RuntimeError:
            app.state.startup_error = (
                f"cannot listen on {host}:{settings.grpc_port} (MNEMO_HOST:MNEMO_GRPC_PORT): in use?"
            )
            raise RuntimeError(app.state.startup_error) from None  # `python -m app` ends with it in one line
        await server.start()
        logger.info("gRPC (Open Inference Protocol) on %s:%d", host, settings.grpc_port)
        try:
            yield
        finally:
            await server.stop(settings.drain_s)
    finally:
        app.state.drain.on_begin.remove(not_serving)
