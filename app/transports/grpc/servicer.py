"""`inference.GRPCInferenceService` (KServe v2 / Triton) over the task services, as REST v2 serves them.

Every RPC goes through `_call`: the API key (`authorization: Bearer <key>` metadata, unless the REST path it
stands for is in MNEMO_OPEN_PATHS), the answer, its status and the metrics (mnemo_grpc_requests_total by method
and code). ModelInfer is REST's POST /v2/models/{name}/infer (app/transports/oip/inference.py): admitted by the
model's batcher, bounded by the request's deadline (MNEMO_REQUEST_TIMEOUT_S, or the gRPC deadline or the
`timeout` parameter when shorter, from arrival), counted in the drain, refused while draining. A cancelled RPC
(client gone, its deadline passed) is cancelled by grpc, which drops its queued rows. Errors map as REST's
statuses do: 400/415/422 INVALID_ARGUMENT, 401 UNAUTHENTICATED, 404 NOT_FOUND, 429 RESOURCE_EXHAUSTED (with
`retry-after` in the trailing metadata), 503 UNAVAILABLE, 504 DEADLINE_EXCEEDED. The methods this server does
not offer (shared memory, model load/unload, trace and log settings, streaming) answer UNIMPLEMENTED.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import grpc
from fastapi import FastAPI
from google.protobuf.message import DecodeError, Message
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument as OrtInvalidArgument
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from app.core.errors import ServiceError, ort_message
from app.core.request_context import request_arrival
from app.runtime.offload import ParseQueueFull, offload, offload_or_shed
from app.runtime.tensors import ProtocolError
from app.transports.access import KeyCheck, api_keys, bearer_token, is_open, open_paths
from app.transports.deadline import Deadline
from app.transports.deadline import within_deadline as bounded
from app.transports.grpc import wire
from app.transports.oip import inference

logger = logging.getLogger("mnemo.grpc")
INLINE_MESSAGE_BYTES = 8192  # smaller messages are decoded and encoded on the event loop, as REST's small bodies are
STATUS_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    404: grpc.StatusCode.NOT_FOUND,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    """The service over the app's registry, drain, metrics and settings (read from `app.state` at each call)."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.state = app.state
        settings = app.state.settings
        keys = api_keys(settings)
        self.keys = KeyCheck(keys) if keys else None
        self.open_set = open_paths(settings)

    # -- health and metadata -----------------------------------------------------------------------
    async def ServerLive(self, request: service_pb2.ServerLiveRequest, context: grpc.aio.ServicerContext) -> Message:
        return await self._call("ServerLive", "/v2/health/live", context, self._live)

    async def ServerReady(self, request: service_pb2.ServerReadyRequest, context: grpc.aio.ServicerContext) -> Message:
        return await self._call("ServerReady", "/v2/health/ready", context, self._ready)

    async def ServerMetadata(self, request: Message, context: grpc.aio.ServicerContext) -> Message:
        return await self._call("ServerMetadata", "/v2", context, self._server_metadata)

    async def ModelReady(self, request: service_pb2.ModelReadyRequest, context: grpc.aio.ServicerContext) -> Message:
        path = f"/v2/models/{request.name}/ready"
        return await self._call("ModelReady", path, context, lambda: self._model_ready(request.name, request.version))

    async def ModelMetadata(self, request: Message, context: grpc.aio.ServicerContext) -> Message:
        def answer() -> Message:
            document = inference.metadata(*inference.find_model(self._registry, request.name, request.version))
            return wire.from_json(document, service_pb2.ModelMetadataResponse())

        return await self._call("ModelMetadata", f"/v2/models/{request.name}", context, answer)

    # -- Triton's extensions -----------------------------------------------------------------------
    async def ModelConfig(self, request: Message, context: grpc.aio.ServicerContext) -> Message:
        def answer() -> Message:
            document = inference.model_config(*inference.find_model(self._registry, request.name, request.version))
            return service_pb2.ModelConfigResponse(config=wire.from_json(document, model_config_pb2.ModelConfig()))

        return await self._call("ModelConfig", f"/v2/models/{request.name}/config", context, answer)

    async def ModelStatistics(self, request: Message, context: grpc.aio.ServicerContext) -> Message:
        def answer() -> Message:
            document = inference.statistics(self._registry, request.name, request.version)
            return wire.from_json(document, service_pb2.ModelStatisticsResponse())

        path = f"/v2/models/{request.name}/stats" if request.name else "/v2/models/stats"
        return await self._call("ModelStatistics", path, context, answer)

    async def RepositoryIndex(self, request: Message, context: grpc.aio.ServicerContext) -> Message:
        def answer() -> Message:
            if request.repository_name:
                raise ProtocolError(
                    f"repository_name {request.repository_name[:64]!r}: this server has one repository; leave it empty"
                )
            index = inference.repository_index(self._registry)
            models = [entry for entry in index if entry["state"] == "READY" or not request.ready]
            return wire.from_json({"models": models}, service_pb2.RepositoryIndexResponse())

        return await self._call("RepositoryIndex", "/v2/repository/index", context, answer)

    # -- inference ---------------------------------------------------------------------------------
    async def ModelInfer(self, request: service_pb2.ModelInferRequest, context: grpc.aio.ServicerContext) -> Message:
        path = f"/v2/models/{request.model_name}/infer"
        return await self._call("ModelInfer", path, context, lambda: self._infer(request, context))

    async def ModelInferBytes(self, data: bytes, context: grpc.aio.ServicerContext) -> Message:
        """ModelInfer from its undecoded message (server.py routes it here): a malformed one is INVALID_ARGUMENT,
        where grpc's own decoding would answer INTERNAL."""
        try:
            request = service_pb2.ModelInferRequest.FromString(data)
        except DecodeError:
            return await self._call("ModelInfer", "/v2/models/infer", context, self._malformed)
        return await self.ModelInfer(request, context)

    def _malformed(self) -> Message:
        raise ProtocolError(
            "The message is not a ModelInferRequest (inference.GRPCInferenceService): it does not parse."
        )

    async def _infer(self, message: service_pb2.ModelInferRequest, context: grpc.aio.ServicerContext) -> Message:
        drain = self.state.drain
        if drain.draining:
            raise ProtocolError("The server is shutting down; retry on another instance.", 503)
        model, codec = inference.find_model(self._registry, message.model_name, message.model_version)
        size = sum(len(raw) for raw in message.raw_input_contents) or message.ByteSize()
        small = size <= INLINE_MESSAGE_BYTES
        parsed, binary = wire.inference_request(message) if small else await offload(wire.inference_request, message)
        task = asyncio.current_task()
        drain.enter(task)
        try:
            answer = await inference.infer(
                model,
                codec,
                parsed,
                binary,
                offload if small else lambda function, *args: self._decode_off_loop(size, function, *args),
                lambda work, timeout_s: self._complete(work, model.name, timeout_s, context),
            )
        finally:
            drain.leave(task)
        response = (model.name, model.entry.version, parsed.id, answer)
        if sum(answer.outputs[name].nbytes for name in answer.wanted) <= INLINE_MESSAGE_BYTES:
            return wire.inference_response(*response)
        return await offload(wire.inference_response, *response)  # large outputs are copied off the event loop

    async def _decode_off_loop(self, size: int, function: Callable[..., Any], *args: Any) -> Any:
        """Decoding on a worker thread in the bounded parse queue, as REST's large bodies (429 while it is full)."""
        try:
            return await offload_or_shed(size, function, *args)
        except ParseQueueFull:
            self.state.metrics.refused("parse_queue_full")
            raise

    async def _complete(
        self,
        work: Coroutine[Any, Any, Any],
        model_name: str,
        timeout_s: float | None,
        context: grpc.aio.ServicerContext,
    ) -> Any:
        """The work within the request's deadline: the server's, or the gRPC deadline or `timeout` if shorter."""
        arrival = request_arrival.get()
        client_timeout_s, source = timeout_s, "the request's timeout parameter"
        remaining = context.time_remaining()
        if remaining is not None:
            rpc_timeout_s = time.perf_counter() - arrival + remaining
            if client_timeout_s is None or rpc_timeout_s < client_timeout_s:
                client_timeout_s, source = rpc_timeout_s, "the gRPC deadline"
        settings, state = self.state.settings, self.state
        deadline = Deadline(
            model_name, state.metrics, state.loop_lag, settings.request_timeout_s, arrival, client_timeout_s, source
        )
        return await bounded(work, deadline)

    # -- the answers of the simple methods -----------------------------------------------------------
    @property
    def _registry(self) -> Any:
        return getattr(self.state, "registry", None)

    def _live(self) -> Message:
        return service_pb2.ServerLiveResponse(live=True)

    def _ready(self) -> Message:
        registry = self._registry
        return service_pb2.ServerReadyResponse(
            ready=not self.state.drain.draining and registry is not None and registry.ready
        )

    def _server_metadata(self) -> Message:
        return service_pb2.ServerMetadataResponse(
            name=self.app.title, version=self.app.version, extensions=inference.EXTENSIONS
        )

    def _model_ready(self, name: str, version: str) -> Message:
        try:
            inference.find_model(self._registry, name, version)
        except ProtocolError as error:
            if error.status != 503:
                raise
            return service_pb2.ModelReadyResponse(ready=False)
        return service_pb2.ModelReadyResponse(ready=True)

    # -- every call --------------------------------------------------------------------------------
    async def _call(
        self,
        method: str,
        path: str,
        context: grpc.aio.ServicerContext,
        handler: Callable[[], Message | Awaitable[Message]],
    ) -> Message:
        """The handler's answer, or its error as a status; the key is checked first; the call is counted."""
        started = time.perf_counter()
        request_arrival.set(started)
        code, details, trailers = grpc.StatusCode.OK, "", ()
        try:
            self._authenticate(path, context)
            answer = handler()
            return await answer if asyncio.iscoroutine(answer) else answer
        except ProtocolError as error:
            code, details = STATUS_CODES.get(error.status, grpc.StatusCode.INTERNAL), error.message
        except ServiceError as error:
            code, details = STATUS_CODES.get(error.status_code, grpc.StatusCode.INTERNAL), str(error.detail)
            trailers = tuple((key.lower(), value) for key, value in (error.headers or {}).items())
        except OrtInvalidArgument as error:
            code, details = grpc.StatusCode.INVALID_ARGUMENT, f"The model rejected the input: {ort_message(error)}"
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            if not self.state.drain.gave_up or context.cancelled():
                raise  # the client left, or its deadline passed: nobody reads an answer
            code, details = grpc.StatusCode.UNAVAILABLE, "The server shut down before the answer (MNEMO_DRAIN_S)."
        except Exception:
            logger.exception("unexpected error in the gRPC method %s", method)
            code, details = grpc.StatusCode.INTERNAL, "Internal error; it has been logged."
        finally:
            metrics = self.state.metrics
            metrics.grpc_requests.labels(method, code.name).inc()
            metrics.grpc_latency.labels(method).observe(time.perf_counter() - started)
        await context.abort(code, details, trailers)

    def _authenticate(self, path: str, context: grpc.aio.ServicerContext) -> None:
        """401 (UNAUTHENTICATED) unless the call carries `authorization: Bearer <key>` or its path is open."""
        if self.keys is None or is_open(path, self.open_set):
            return
        header = next((value for key, value in context.invocation_metadata() or () if key == "authorization"), "")
        presented = bearer_token(header.encode() if isinstance(header, str) else header)
        if presented is None or not self.keys.known(presented):
            raise ProtocolError(
                "A valid API key is required: send the metadata authorization: Bearer <key>.", status=401
            )
