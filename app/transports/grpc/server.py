"""The gRPC server, on the HTTP app's event loop in its lifespan (MNEMO_GRPC_PORT; SO_REUSEPORT across workers).

Messages are bounded by MNEMO_MAX_BODY_BYTES; on shutdown calls in flight get MNEMO_DRAIN_S, before the engine stops.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import grpc
from fastapi import FastAPI
from tritonclient.grpc import service_pb2_grpc

from app.transports.grpc.servicer import InferenceServicer

logger = logging.getLogger("mnemo.grpc")
INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"


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
        options=[
            ("grpc.max_receive_message_length", settings.max_body_bytes),
            ("grpc.so_reuseport", int(settings.workers > 1)),
        ],
    )
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    try:
        server.add_insecure_port(f"{host}:{settings.grpc_port}")
    except RuntimeError:
        app.state.startup_error = f"cannot listen on {host}:{settings.grpc_port} (MNEMO_HOST:MNEMO_GRPC_PORT): in use?"
        raise RuntimeError(app.state.startup_error) from None  # `python -m app` ends with it in one line
    await server.start()
    logger.info("gRPC (Open Inference Protocol) on %s:%d", host, settings.grpc_port)
    try:
        yield
    finally:
        await server.stop(settings.drain_s)
