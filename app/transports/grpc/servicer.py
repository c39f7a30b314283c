"""`inference.GRPCInferenceService` (KServe v2 / Triton) over app/transports/oip/inference.py, as REST v2 serves it.

A `ModelInferRequest` becomes the `InferenceRequest` and binary tensor data that REST's body would carry, so both
decode tensors with the same code; outputs go as `raw_output_contents`. Methods not offered answer UNIMPLEMENTED.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

import grpc
from fastapi import FastAPI
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from pydantic import ValidationError
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from app.core.errors import ServiceError
from app.core.request_context import request_arrival
from app.runtime.offload import offload_if
from app.runtime.tensors import ProtocolError
from app.transports.access import api_key_check
from app.transports.deadline import Deadline, within_deadline
from app.transports.oip import inference
from app.transports.oip.inference import Answer, registry_of
from app.transports.oip.tensors import InferenceRequest, tensor_bytes

logger = logging.getLogger("mnemo.grpc")
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
# the field of InferTensorContents that holds each datatype
CONTENTS = {datatype: f"{datatype.lower()}_contents" for datatype in ("BOOL", "INT64", "FP32", "FP64", "BYTES")}
CONTENTS |= {"INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents", "UINT8": "uint_contents"}


def rpc(path: Callable[[Any], str]) -> Callable[[Callable[..., Any]], Callable[..., Awaitable[Message]]]:
    """An RPC answered through `InferenceServicer._call`, its API key checked as REST's `path(request)` would be."""

    def register(answer: Callable[..., Any]) -> Callable[..., Awaitable[Message]]:
        async def method(self: InferenceServicer, request: Any, context: grpc.aio.ServicerContext) -> Message:
            return await self._call(answer.__name__, path(request), context, lambda: answer(self, request, context))

        return method

    return register


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    """The service over the app's registry, drain, metrics and settings (read from `app.state` at each call)."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.state = app.state
        self.keys = api_key_check(app.state.settings)

    @rpc(lambda request: "/v2/health/live")
    def ServerLive(self, request: Message, context: Any) -> Message:
        return service_pb2.ServerLiveResponse(live=True)

    @rpc(lambda request: "/v2/health/ready")
    def ServerReady(self, request: Message, context: Any) -> Message:
        return service_pb2.ServerReadyResponse(ready=inference.server_ready(self.state))

    @rpc(lambda request: "/v2")
    def ServerMetadata(self, request: Message, context: Any) -> Message:
        app = self.app
        return service_pb2.ServerMetadataResponse(name=app.title, version=app.version, extensions=inference.EXTENSIONS)

    @rpc(lambda request: f"/v2/models/{request.name}/ready")
    def ModelReady(self, request: Message, context: Any) -> Message:
        try:
            inference.find_model(self._registry, request.name, request.version)
        except ProtocolError as error:
            if error.status != 503:
                raise
            return service_pb2.ModelReadyResponse(ready=False)
        return service_pb2.ModelReadyResponse(ready=True)

    @rpc(lambda request: f"/v2/models/{request.name}")
    def ModelMetadata(self, request: Message, context: Any) -> Message:
        document = inference.metadata(*inference.find_model(self._registry, request.name, request.version))
        return _from_json(document, service_pb2.ModelMetadataResponse())

    @rpc(lambda request: f"/v2/models/{request.name}/config")
    def ModelConfig(self, request: Message, context: Any) -> Message:
        document = inference.model_config(*inference.find_model(self._registry, request.name, request.version))
        return service_pb2.ModelConfigResponse(config=_from_json(document, model_config_pb2.ModelConfig()))

    @rpc(lambda request: f"/v2/models/{request.name}/stats" if request.name else "/v2/models/stats")
    def ModelStatistics(self, request: Message, context: Any) -> Message:
        document = inference.statistics(self._registry, request.name, request.version)
        return _from_json(document, service_pb2.ModelStatisticsResponse())

    @rpc(lambda request: "/v2/repository/index")
    def RepositoryIndex(self, request: Message, context: Any) -> Message:
        if request.repository_name:
            raise ProtocolError(
                f"repository_name {request.repository_name[:64]!r}: this server has one repository; leave it empty"
            )
        index = inference.repository_index(self._registry, request.ready)
        return _from_json({"models": index}, service_pb2.RepositoryIndexResponse())

    @rpc(lambda request: f"/v2/models/{request.model_name}/infer")
    async def ModelInfer(self, message: service_pb2.ModelInferRequest, context: grpc.aio.ServicerContext) -> Message:
        drain = self.state.drain
        if drain.draining:
            raise ProtocolError("The server is shutting down; retry on another instance.", 503)
        model, codec = inference.find_model(self._registry, message.model_name, message.model_version)
        size = sum(len(raw) for raw in message.raw_input_contents) or message.ByteSize()
        parsed, binary = await offload_if(size > inference.INLINE_BYTES, inference_request, message)
        task = asyncio.current_task()
        drain.enter(task)
        try:
            bounded = functools.partial(self._complete, model.name, context)
            answer = await inference.infer(model, codec, parsed, binary, size, self.state.metrics, bounded)
        finally:
            drain.leave(task)
        response = (model.name, model.entry.version, parsed.id, answer)
        return await offload_if(not answer.small, inference_response, *response)  # large outputs copied off the loop

    async def ModelInferBytes(self, data: bytes, context: grpc.aio.ServicerContext) -> Message:
        """ModelInfer from its undecoded message (server.py routes it here): a malformed one is INVALID_ARGUMENT,
        where grpc's own decoding would answer INTERNAL."""
        try:
            request = service_pb2.ModelInferRequest.FromString(data)
        except DecodeError:
            return await self._call("ModelInfer", "/v2/models/infer", context, _malformed)
        return await self.ModelInfer(request, context)

    async def _complete(
        self, model: str, context: grpc.aio.ServicerContext, work: Coroutine[Any, Any, Any], timeout_s: float | None
    ) -> Any:
        """The work within the request's deadline: the server's, or the gRPC deadline or `timeout` if shorter."""
        arrival, remaining = request_arrival.get(), context.time_remaining()
        rpc_timeout_s = None if remaining is None else time.perf_counter() - arrival + remaining
        source = "the request's timeout parameter"
        if rpc_timeout_s is not None and (timeout_s is None or rpc_timeout_s < timeout_s):
            timeout_s, source = rpc_timeout_s, "the gRPC deadline"
        state = self.state
        limit_s = state.settings.request_timeout_s
        deadline = Deadline(model, state.metrics, state.loop_lag, limit_s, arrival, timeout_s, source)
        return await within_deadline(work, deadline)

    @property
    def _registry(self) -> Any:
        return registry_of(self.state)

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
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            if not self.state.drain.gave_up or context.cancelled():
                raise  # the client left, or its deadline passed: nobody reads an answer
            code, details = grpc.StatusCode.UNAVAILABLE, "The server shut down before the answer (MNEMO_DRAIN_S)."
        except Exception as error:
            refused = inference.refusal(error)
            if refused is None:
                logger.exception("unexpected error in the gRPC method %s", method)
                code, details = grpc.StatusCode.INTERNAL, "Internal error; it has been logged."
            else:
                status, details, headers = refused
                code = STATUS_CODES.get(status, grpc.StatusCode.INTERNAL)
                trailers = tuple((key.lower(), value) for key, value in headers.items())
        finally:
            metrics = self.state.metrics
            metrics.grpc_requests.labels(method, code.name).inc()
            metrics.grpc_latency.labels(method).observe(time.perf_counter() - started)
        await context.abort(code, details, trailers)

    def _authenticate(self, path: str, context: grpc.aio.ServicerContext) -> None:
        """401 (UNAUTHENTICATED) unless the call carries `authorization: Bearer <key>` or its path is open."""
        header = next((value for key, value in context.invocation_metadata() or () if key == "authorization"), "")
        if self.keys is not None and self.keys.refusal(path, header.encode() if isinstance(header, str) else header):
            raise ProtocolError(
                "A valid API key is required: send the metadata authorization: Bearer <key>.", status=401
            )


def _malformed() -> Message:
    raise ProtocolError("The message is not a ModelInferRequest (inference.GRPCInferenceService): it does not parse.")


def _from_json(document: Mapping[str, Any], message: Message) -> Message:
    """A protocol answer built as JSON (oip/inference.py) read into its gRPC message."""
    try:
        return json_format.ParseDict(document, message)
    except json_format.ParseError as error:  # a bug here, not the client's
        raise ServiceError(f"Could not encode the answer: {error}") from None


def _parameters(message: Mapping[str, service_pb2.InferParameter], where: str) -> dict[str, Any]:
    """A `map<string, InferParameter>` as the values it holds; an unset one is a 400 naming it."""
    values = {}
    for name, parameter in message.items():
        kind = parameter.WhichOneof("parameter_choice")
        if kind is None:
            raise ProtocolError(f"{where}.{name[:64]} holds no value")
        values[name] = getattr(parameter, kind)
    return values


def inference_request(message: service_pb2.ModelInferRequest) -> tuple[InferenceRequest, bytes]:
    """The request as the protocol's `InferenceRequest` and the binary tensor data its inputs claim:
    `raw_input_contents` (one entry per input, in order) as binary data, typed `contents` as JSON `data`."""
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
        entry = {
            "name": tensor.name,
            "shape": list(tensor.shape),
            "datatype": tensor.datatype,
            "parameters": parameters,
        }
        if "binary_data_size" in parameters:
            raise ProtocolError(f"{where}.parameters.binary_data_size is REST's; over gRPC send raw_input_contents")
        if raw:
            if tensor.HasField("contents"):
                raise ProtocolError(f"{where} has contents and raw_input_contents; send one of them for every input")
            parameters["binary_data_size"] = len(raw[index])
        else:
            entry["data"] = _contents(tensor, where)
        inputs.append(entry)
    outputs = [
        {"name": output.name, "parameters": _parameters(output.parameters, f"outputs[{index}].parameters")}
        for index, output in enumerate(message.outputs)
    ]
    parameters = _parameters(message.parameters, "parameters")
    try:
        request = InferenceRequest.model_validate(
            {"id": message.id or None, "parameters": parameters, "inputs": inputs, "outputs": outputs}
        )
    except ValidationError as error:
        raise inference.invalid_request(error) from None
    return request, b"".join(raw)


def _contents(tensor: service_pb2.ModelInferRequest.InferInputTensor, where: str) -> list[Any]:
    """The input's typed contents as a flat list; a datatype that has no such field (FP16) needs raw contents."""
    field = CONTENTS.get(tensor.datatype)
    if field is None:
        if tensor.datatype == "FP16":
            raise ProtocolError(f"{where} ({tensor.name}): {tensor.datatype} data must be sent in raw_input_contents")
        return []  # an unknown datatype: the check of the input's header names it
    others = [descriptor.name for descriptor, _ in tensor.contents.ListFields() if descriptor.name != field]
    if others:
        raise ProtocolError(
            f"{where} ({tensor.name}): {tensor.datatype} data goes in contents.{field}, not contents.{others[0]}"
        )
    values = list(getattr(tensor.contents, field))
    if tensor.datatype != "BYTES":
        return values
    try:
        return [value.decode("utf-8") for value in values]
    except UnicodeDecodeError:
        raise ProtocolError(f"{where} ({tensor.name}): a BYTES element is not UTF-8 text") from None


def inference_response(
    model_name: str, version: str, request_id: str | None, answer: Answer
) -> service_pb2.ModelInferResponse:
    """The `ModelInferResponse`: every requested output as raw contents."""
    datatypes = {spec.name: spec.datatype for spec in answer.specs}
    response = service_pb2.ModelInferResponse(model_name=model_name, model_version=version, id=request_id or "")
    for name in answer.wanted:
        array = answer.outputs[name]
        response.outputs.add(name=name, datatype=datatypes[name], shape=array.shape)
        response.raw_output_contents.append(tensor_bytes(array, datatypes[name]))
    return response
