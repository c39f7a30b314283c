"""The Open Inference Protocol over gRPC (KServe v2 / Triton's `inference.GRPCInferenceService`, and
`grpc.health.v1.Health`) on MNEMO_GRPC_PORT and the HTTP app's event loop, through REST v2's code."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any
from urllib.parse import quote

import grpc
from fastapi import FastAPI
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument as OrtInvalidArgument
from tritonclient.grpc import service_pb2

from app.core.errors import INTERNAL_ERROR, ModelNotReady, ServiceError, ort_message
from app.core.request_context import request_arrival
from app.runtime.model import ProtocolError, ServedModel
from app.transports.oip import inference
from app.transports.oip.inference import EXTENSIONS, model_config, model_metadata, model_statistics, repository_index
from app.transports.oip.tensors import InferenceRequest, Output, parse_request, tensor_bytes, utf8_texts
from app.transports.operations import readiness

logger = logging.getLogger("mnemo.grpc")
INFERENCE_SERVICE = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
# the status of each HTTP status the service answers with (any other is INTERNAL)
CODES = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED"}
CODES |= {503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}
# the field of InferTensorContents that holds each datatype
CONTENTS = {datatype: f"{datatype.lower()}_contents" for datatype in ("BOOL", "INT64", "FP32", "FP64", "BYTES")}
CONTENTS |= {"INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents", "UINT8": "uint_contents"}
API_KEY_REQUIRED = "A valid API key is required: send the metadata authorization: Bearer <key>."


def model_ready(app: FastAPI, request: Any) -> dict:
    with contextlib.suppress(ModelNotReady):  # loaded, else not ready; an unknown model is NOT_FOUND
        return {"ready": inference.model_ready(app.state, request.name, request.version)["ready"]}
    return {"ready": False}


# each RPC: the /v2 REST path whose API-key rule it follows ({}: the model), its answer as REST's dict (None: infer)
RPCS: dict[str, tuple[str, Callable[[FastAPI, Any], dict] | None]] = {
    "ServerLive": ("/health/live", lambda app, _: {"live": True}),
    "ServerReady": ("/health/ready", lambda app, _: {"ready": readiness(app.state)[0] == 200}),
    "ServerMetadata": ("", lambda app, _: {"name": app.title, "version": app.version, "extensions": [*EXTENSIONS]}),
    "ModelReady": ("/models/{}/ready", model_ready),
    "ModelMetadata": ("/models/{}", lambda app, r: model_metadata(app.state, r.name, r.version)),
    "ModelConfig": ("/models/{}/config", lambda app, r: {"config": model_config(app.state, r.name, r.version)}),
    "ModelStatistics": ("/models/{}/stats", lambda app, r: model_statistics(app.state, r.name, r.version)),
    "RepositoryIndex": (
        "/repository/index",
        lambda app, r: {"models": repository_index(app.state, r.ready, r.repository_name)},
    ),
    "ModelInfer": ("/models/{}/infer", None),
}


def rpc_method(app: FastAPI, name: str) -> grpc.RpcMethodHandler:
    """The RPC `name`: its own decode (malformed: INVALID_ARGUMENT, not UNKNOWN), REST's API-key rule, each counted."""
    path, answer = RPCS[name]
    request_type, response_type = (getattr(service_pb2, f"{name}{part}") for part in ("Request", "Response"))

    async def call(data: bytes, context: grpc.aio.ServicerContext) -> Message:
        started = time.perf_counter()
        request_arrival.set(started)
        code, details, trailers = grpc.StatusCode.OK, "", ()
        app.state.drain.enter(task := asyncio.current_task())  # as the edge's gated paths: cancelled if it gives up
        try:
            request = None
            with contextlib.suppress(DecodeError):
                request = request_type.FromString(data)
            model = getattr(request, "name", None) or getattr(request, "model_name", "")
            sent = next((value for key, value in context.invocation_metadata() or () if key == "authorization"), "")
            # quoted: a name holding '/' stays one segment, never another (open) path; no name: /v2/models/stats
            rest_path = "/v2" + path.format(quote(model, safe="")).replace("//stats", "/stats")
            if app.state.api_keys.refusal(rest_path, sent.encode()):
                code, details = grpc.StatusCode.UNAUTHENTICATED, API_KEY_REQUIRED
            elif request is None:
                raise ProtocolError(f"The message is not a {name}Request ({INFERENCE_SERVICE}): it does not parse.")
            elif answer is None and app.state.drain.draining:
                code, details = grpc.StatusCode.UNAVAILABLE, "The server is shutting down; retry on another instance."
            elif answer is None:  # its gRPC deadline counted from the call's arrival, as every deadline is
                model, codec = inference.find_model(app.state, request.model_name, request.model_version)
                rpc_s = None if (left := context.time_remaining()) is None else time.perf_counter() - started + left
                decode = functools.partial(inference_request, request)
                return await inference.infer(
                    app.state, model, codec, len(data), decode, inference_response, None, rpc_s
                )
            else:
                return json_format.ParseDict(answer(app, request), response_type())
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            if not app.state.drain.gave_up or context.cancelled():
                raise  # the client left, or its deadline passed: nobody reads an answer
            code, details = grpc.StatusCode.UNAVAILABLE, "The server shut down before the answer (MNEMO_DRAIN_S)."
        except ServiceError as error:
            code, details = grpc.StatusCode[CODES.get(error.status_code, "INTERNAL")], error.detail
            trailers = tuple((key.lower(), value) for key, value in (error.headers or {}).items())
        except OrtInvalidArgument as error:
            code, details = grpc.StatusCode.INVALID_ARGUMENT, ort_message(error)
        except Exception:
            logger.exception("unexpected error in the gRPC method %s", name)
            code, details = grpc.StatusCode.INTERNAL, INTERNAL_ERROR["detail"]
        finally:
            app.state.drain.leave(task)
            app.state.metrics.grpc_requests.labels(name, code.name).inc()
            app.state.metrics.grpc_latency.labels(name).observe(time.perf_counter() - started)
        await context.abort(code, details, trailers)

    return grpc.unary_unary_rpc_method_handler(call, response_serializer=response_type.SerializeToString)


def _parameters(message: Mapping[str, service_pb2.InferParameter], where: str) -> dict[str, Any]:
    """A `map<string, InferParameter>` as the values it holds; an unset one is a 400 naming it."""
    kinds = {name: parameter.WhichOneof("parameter_choice") for name, parameter in message.items()}
    if unset := [name for name, kind in kinds.items() if kind is None]:
        raise ProtocolError(f"{where}.{unset[0][:64]} holds no value")
    return {name: getattr(message[name], kind) for name, kind in kinds.items()}


def inference_request(message: service_pb2.ModelInferRequest) -> tuple[InferenceRequest, bytes]:
    """REST's request and binary data: `raw_input_contents` as binary data, typed `contents` as JSON `data`."""
    raw = message.raw_input_contents
    if raw and len(raw) != len(message.inputs):
        raise ProtocolError(
            f"raw_input_contents has {len(raw)} entries for {len(message.inputs)} inputs: send one per input, in "
            "the order of inputs"
        )
    inputs = []
    for index, tensor in enumerate(message.inputs):
        where = f"inputs[{index}]"
        parameters = _parameters(tensor.parameters, f"{where}.parameters")
        if "binary_data_size" in parameters:
            raise ProtocolError(f"{where}.parameters.binary_data_size is REST's; over gRPC send raw_input_contents")
        if raw:
            if tensor.HasField("contents"):
                raise ProtocolError(f"{where} has contents and raw_input_contents; send one of them for every input")
            parameters["binary_data_size"] = len(raw[index])
        data = None if raw else _contents(tensor, where)
        inputs.append(
            dict(name=tensor.name, shape=list(tensor.shape), datatype=tensor.datatype, parameters=parameters, data=data)
        )
    outputs = [
        {"name": output.name, "parameters": _parameters(output.parameters, f"outputs[{index}].parameters")}
        for index, output in enumerate(message.outputs)
    ]
    parameters = _parameters(message.parameters, "parameters")
    request = {"id": message.id or None, "parameters": parameters, "inputs": inputs, "outputs": outputs}
    return parse_request(request), b"".join(raw)


def _contents(tensor: service_pb2.ModelInferRequest.InferInputTensor, where: str) -> list[Any]:
    """The input's typed contents as a flat list; a datatype that has no such field (FP16) needs raw contents."""
    if (field := CONTENTS.get(tensor.datatype)) is None:
        if tensor.datatype == "FP16":
            raise ProtocolError(f"{where} ({tensor.name}): {tensor.datatype} data must be sent in raw_input_contents")
        return []  # an unknown datatype: the check of the input's header names it
    if others := [descriptor.name for descriptor, _ in tensor.contents.ListFields() if descriptor.name != field]:
        raise ProtocolError(
            f"{where} ({tensor.name}): {tensor.datatype} data goes in contents.{field}, not contents.{others[0]}"
        )
    values = list(getattr(tensor.contents, field))
    return utf8_texts(values, f"{where} ({tensor.name})") if tensor.datatype == "BYTES" else values


def inference_response(model: ServedModel, request: InferenceRequest, outputs: list[Output]) -> Message:
    """The `ModelInferResponse`: every requested output as raw contents."""
    response = service_pb2.ModelInferResponse(model_name=model.name, model_version=model.entry.version)
    response.id = request.id or ""
    for name, datatype, array, _ in outputs:
        response.outputs.add(name=name, datatype=datatype, shape=array.shape)
        response.raw_output_contents.append(tensor_bytes(array, datatype))
    return response


@contextlib.asynccontextmanager
async def serve_grpc(app: FastAPI) -> AsyncIterator[None]:
    """Serve the Open Inference Protocol over gRPC on MNEMO_GRPC_PORT while the block runs."""
    settings = app.state.settings
    server = grpc.aio.server(
        maximum_concurrent_rpcs=settings.max_connections,  # as REST's connections bound its requests in flight
        options=[
            ("grpc.max_receive_message_length", settings.max_body_bytes),
            ("grpc.so_reuseport", int(settings.workers > 1)),
        ],
    )
    methods = {name: rpc_method(app, name) for name in RPCS}  # as grpc's generated `add_..._to_server` does
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(INFERENCE_SERVICE, methods),))
    server.add_registered_method_handlers(INFERENCE_SERVICE, methods)
    health_servicer = health.aio.HealthServicer()  # open to all, as the probe port is
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    loop = asyncio.get_running_loop()

    def not_serving() -> None:  # called in the signal handler that begins the drain: NOT_SERVING for good
        asyncio.run_coroutine_threadsafe(health_servicer.enter_graceful_shutdown(), loop)

    app.state.drain.on_begin.append(not_serving)  # before the state is read: a drain beginning now is not missed
    try:
        ready = readiness(app.state)[0] == 200
        status = health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
        for service in ("", INFERENCE_SERVICE):
            await health_servicer.set(service, status)
        address = settings.address(settings.grpc_port)
        try:
            server.add_insecure_port(address)
        except RuntimeError:
            app.state.startup_error = f"cannot listen on {address} (MNEMO_HOST:MNEMO_GRPC_PORT): in use?"
            raise RuntimeError(app.state.startup_error) from None  # `python -m app` ends with it in one line
        await server.start()
        logger.info("gRPC (Open Inference Protocol) on %s", address)
        yield
    finally:
        await server.stop(settings.drain_s)  # a server not started yet stops at once
        app.state.drain.on_begin.remove(not_serving)
