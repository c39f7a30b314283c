"""The Open Inference Protocol (KServe v2) REST endpoints over the task services.

Health and metadata: GET /v2, /v2/health/live, /v2/health/ready, /v2/models/{name}[/versions/{v}]
and .../ready. Inference: POST /v2/models/{name}[/versions/{v}]/infer, admitted by the model's
batcher (429), bounded by the request deadline (504) and batched with the task API's requests;
the request's `parameters` are checked by parameters.py (`timeout` shortens the deadline).
Every error is the protocol's `{"error": "<sentence>"}`: 400 bad tensors or parameters, 404 unknown
model or version, 429/503/504 from the engine.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

from fastapi import APIRouter, Request
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument as OrtInvalidArgument
from pydantic import ValidationError
from starlette.responses import Response

from app.core.errors import ServiceError, ort_message
from app.core.responses import JsonResponse
from app.runtime.model import ServedModel, Task, TensorCodec
from app.runtime.offload import offload
from app.transports.access import BINARY_HEADER_LENGTH
from app.transports.http import (
    check_declared_charset,
    check_identity_encoding,
    check_utf8_body,
    complete,
    json_body,
    parse_off_loop,
)
from app.transports.oip.parameters import check_parameters
from app.transports.oip.schemas import (
    InferenceResponse,
    Liveness,
    ModelMetadata,
    ModelReadiness,
    ServerMetadata,
    ServerReadiness,
)
from app.transports.oip.tensors import (
    InferenceRequest,
    ProtocolError,
    decode_inputs,
    encode_response,
    requested_outputs,
)

logger = logging.getLogger("mnemo.oip")


HEADER_LENGTH_VALUE = re.compile(r"[0-9]{1,15}")  # ASCII digits only: int() would also take "²" or 5,000 digits
INLINE_BODY_BYTES = 8192
router = APIRouter(prefix="/v2", tags=["open inference protocol"])


def _protocol_errors(handler: Callable[..., Awaitable[Response]]) -> Callable[..., Awaitable[Response]]:
    """Answer every failure of `handler` in the protocol's error shape."""

    @functools.wraps(handler)
    async def guarded(*args: Any, **kwargs: Any) -> Response:
        try:
            return await handler(*args, **kwargs)
        except ProtocolError as error:
            return JsonResponse({"error": error.message}, error.status)
        except ServiceError as error:
            return JsonResponse({"error": error.detail}, error.status_code, headers=error.headers)
        except OrtInvalidArgument as error:
            return JsonResponse({"error": f"The model rejected the input: {ort_message(error)}"}, 400)
        except Exception:
            logger.exception("unexpected error in the protocol endpoint %s", handler.__name__)
            return JsonResponse({"error": "Internal error; it has been logged."}, 500)

    return guarded


def _model(request: Request, name: str, version: str | None = None) -> tuple[ServedModel, TensorCodec]:
    """The named model and its task's tensor codec; 404 when unknown (or another version), 503 when not loaded."""
    registry = getattr(request.app.state, "registry", None)
    if registry is None:
        raise ProtocolError("Models are still loading.", 503)
    codecs = {task: codec for task, codec in _codecs(registry.tasks)}
    model = registry.models.get(name)
    if model is None or model.task not in codecs:
        known = ", ".join(sorted(n for n, m in registry.models.items() if m.task in codecs)) or "none"
        raise ProtocolError(f"Unknown model {name[:100]!r}; available: {known}.", 404)
    if version is not None and version != model.entry.version:
        raise ProtocolError(f"Model {name} has no version {version[:40]!r}; it serves {model.entry.version}.", 404)
    if not model.ready:
        raise ProtocolError(f"Model {name} is not ready: {model.error}", 503)
    return model, codecs[model.task]


def _codecs(tasks: Mapping[str, Task]) -> Iterator[tuple[str, TensorCodec]]:
    """The tasks that have a tensor codec, with it."""
    for name, task in tasks.items():
        codec = getattr(task, "tensors", None)
        if codec is not None:
            yield name, codec


@router.get("", operation_id="oip_server_metadata", response_model=ServerMetadata)
async def server_metadata(request: Request) -> JsonResponse:
    """Server name, version and protocol extensions."""
    return JsonResponse(
        {"name": request.app.title, "version": request.app.version, "extensions": ["binary_tensor_data"]}
    )


@router.get("/health/live", operation_id="oip_live", response_model=Liveness)
async def live() -> JsonResponse:
    """200 while the process is up."""
    return JsonResponse({"live": True})


@router.get("/health/ready", operation_id="oip_ready", response_model=ServerReadiness)
async def ready(request: Request) -> JsonResponse:
    """200 when every model is loaded and the server is not draining; else 503."""
    registry = getattr(request.app.state, "registry", None)
    is_ready = not request.app.state.drain.draining and registry is not None and registry.ready
    return JsonResponse({"ready": is_ready}, 200 if is_ready else 503)


@router.get("/models/{name}", operation_id="oip_model_metadata", response_model=ModelMetadata)
async def model_metadata(request: Request, name: str) -> Response:
    """The model's inputs and outputs (name, datatype, shape; -1 = any size) and its platform."""
    return await _metadata(request, name, None)


@router.get("/models/{name}/versions/{version}", include_in_schema=False)
async def model_version_metadata(request: Request, name: str, version: str) -> Response:
    return await _metadata(request, name, version)


@router.get("/models/{name}/ready", operation_id="oip_model_ready", response_model=ModelReadiness)
async def model_ready(request: Request, name: str) -> Response:
    """200 when the model is loaded, 404 when unknown, 503 when it failed to load."""
    return await _model_ready(request, name, None)


@router.get("/models/{name}/versions/{version}/ready", include_in_schema=False)
async def model_version_ready(request: Request, name: str, version: str) -> Response:
    return await _model_ready(request, name, version)


@router.post(
    "/models/{name}/infer",
    operation_id="oip_infer",
    response_model=InferenceResponse,
    responses={200: {"content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}},
    openapi_extra=json_body(InferenceRequest),
)
async def infer(request: Request, name: str) -> Response:
    """Run the model on the request's tensors (JSON data, or the binary tensor data extension).

    The answer is JSON, or with binary outputs (`binary_data_output`) application/octet-stream: the JSON
    header, `Inference-Header-Content-Length` bytes long, then the tensors' bytes.
    """
    return await _infer(request, name, None)


@router.post("/models/{name}/versions/{version}/infer", include_in_schema=False)
async def infer_version(request: Request, name: str, version: str) -> Response:
    return await _infer(request, name, version)


@_protocol_errors
async def _metadata(request: Request, name: str, version: str | None) -> JsonResponse:
    model, codec = _model(request, name, version)
    return JsonResponse(
        {
            "name": model.name,
            "versions": [model.entry.version],
            "platform": codec.PLATFORM,
            "inputs": [spec.metadata() for spec in codec.inputs(model)],
            "outputs": [spec.metadata() for spec in codec.outputs(model)],
        }
    )


@_protocol_errors
async def _model_ready(request: Request, name: str, version: str | None) -> JsonResponse:
    model, _ = _model(request, name, version)
    return JsonResponse({"name": model.name, "ready": True})


@_protocol_errors
async def _infer(request: Request, name: str, version: str | None) -> Response:
    model, codec = _model(request, name, version)
    check_declared_charset(request)
    check_identity_encoding(request)
    body, binary = _split_body(await request.body(), request.headers.get(BINARY_HEADER_LENGTH))
    check_utf8_body(body)
    size = len(body) + len(binary)
    try:
        parsed = (
            InferenceRequest.model_validate_json(body)
            if size <= INLINE_BODY_BYTES
            else (await parse_off_loop(request, size, InferenceRequest.model_validate_json, body))
        )
    except ValidationError as error:
        first = error.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        raise ProtocolError(f"invalid inference request: {where}: {first['msg']}") from None
    timeout_s = check_parameters(parsed)
    wanted = requested_outputs(parsed, codec.outputs(model))
    decode = (parsed, binary, codec.inputs(model))
    tensors = await (
        offload(decode_inputs, *decode)
        if size <= INLINE_BODY_BYTES
        else parse_off_loop(request, size, decode_inputs, *decode)
    )
    prepared = await offload(codec.prepare, model, tensors)
    with model.batcher.admit(prepared.rows, prepared.cells):
        outputs = await complete(request, codec.infer(model, prepared), model.name, timeout_s)
    header = {"model_name": model.name, "model_version": model.entry.version}
    if parsed.id is not None:
        header["id"] = parsed.id
    content, header_length = await offload(encode_response, header, outputs, codec.outputs(model), wanted)
    if header_length is None:
        return Response(content, media_type="application/json")
    return Response(
        content, media_type="application/octet-stream", headers={"Inference-Header-Content-Length": str(header_length)}
    )


def _split_body(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    """The JSON header and the binary tensor data that follows it (empty without the extension)."""
    if header_length is None:
        return body, b""
    if HEADER_LENGTH_VALUE.fullmatch(header_length) is None or int(header_length) > len(body):
        raise ProtocolError(
            f"Inference-Header-Content-Length {header_length[:20]!r} does not fit the body of {len(body)} bytes: "
            "it must be the JSON header's length in bytes (ASCII digits)"
        )
    return body[: int(header_length)], body[int(header_length) :]
