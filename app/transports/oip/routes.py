"""The Open Inference Protocol (KServe v2) REST endpoints over the task services.

Health and metadata: GET /v2, /v2/health/live, /v2/health/ready, /v2/models/{name}[/versions/{v}]
and .../ready. Triton's extensions that its tools read: GET .../config (the model configuration), GET
/v2/models/stats and .../stats (statistics), POST /v2/repository/index.
Inference: POST /v2/models/{name}[/versions/{v}]/infer, admitted by the model's
batcher (429), bounded by the request deadline (504) and batched with the task API's requests;
the request's `parameters` are checked by parameters.py (`timeout` shortens the deadline); what it does
over the task services is inference.py, which the gRPC transport shares.
Every error is the protocol's `{"error": "<sentence>"}`: 400 bad tensors or parameters, 404 unknown
model or version, 429/503/504 from the engine.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument as OrtInvalidArgument
from pydantic import ValidationError
from starlette.responses import Response

from app.core.errors import ServiceError, ort_message
from app.core.responses import JsonResponse
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
from app.transports.oip import inference
from app.transports.oip.schemas import (
    InferenceResponse,
    Liveness,
    ModelMetadata,
    ModelReadiness,
    RepositoryIndexRequest,
    ServerMetadata,
    ServerReadiness,
)
from app.transports.oip.tensors import InferenceRequest, ProtocolError, encode_response

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


def _registry(request: Request):
    return getattr(request.app.state, "registry", None)


@router.get("", operation_id="oip_server_metadata", response_model=ServerMetadata)
async def server_metadata(request: Request) -> JsonResponse:
    """Server name, version and protocol extensions."""
    return JsonResponse(
        {
            "name": request.app.title,
            "version": request.app.version,
            "extensions": ["binary_tensor_data", *inference.EXTENSIONS],
        }
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


@router.get("/models/stats", operation_id="oip_statistics")
async def all_statistics(request: Request) -> Response:
    """Triton's statistics extension for every model: success/fail counts, queue and compute durations (ns),
    inference and execution counts, from each model's batcher in this worker."""
    return await _statistics(request, "", "")


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


@router.get("/models/{name}/config", operation_id="oip_model_config")
async def model_config(request: Request, name: str) -> Response:
    """Triton's model configuration: inputs and outputs (dims without the batch dimension, -1 = any size),
    `max_batch_size` and the dynamic batching in force."""
    return await _config(request, name, None)


@router.get("/models/{name}/versions/{version}/config", include_in_schema=False)
async def model_version_config(request: Request, name: str, version: str) -> Response:
    return await _config(request, name, version)


@router.get("/models/{name}/stats", operation_id="oip_model_statistics")
async def model_statistics(request: Request, name: str) -> Response:
    """Triton's statistics extension for one model."""
    return await _statistics(request, name, "")


@router.get("/models/{name}/versions/{version}/stats", include_in_schema=False)
async def model_version_statistics(request: Request, name: str, version: str) -> Response:
    return await _statistics(request, name, version)


@router.post("/repository/index", operation_id="oip_repository_index")
async def repository_index(request: Request) -> Response:
    """Triton's repository index: every model with its state (READY, or UNAVAILABLE with the reason); the body
    `{"ready": true}` (optional) lists the ready ones only."""
    return await _index(request)


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
    return JsonResponse(inference.metadata(*inference.find_model(_registry(request), name, version)))


@_protocol_errors
async def _model_ready(request: Request, name: str, version: str | None) -> JsonResponse:
    model, _ = inference.find_model(_registry(request), name, version)
    return JsonResponse({"name": model.name, "ready": True})


@_protocol_errors
async def _config(request: Request, name: str, version: str | None) -> JsonResponse:
    return JsonResponse(inference.model_config(*inference.find_model(_registry(request), name, version)))


@_protocol_errors
async def _statistics(request: Request, name: str, version: str) -> JsonResponse:
    return JsonResponse(inference.statistics(_registry(request), name, version))


@_protocol_errors
async def _index(request: Request) -> JsonResponse:
    body = await request.body()
    try:
        ready_only = RepositoryIndexRequest.model_validate_json(body or b"{}").ready
    except ValidationError as error:
        raise inference.invalid_request(error, "repository index request") from None
    index = inference.repository_index(_registry(request))
    return JsonResponse([entry for entry in index if entry["state"] == "READY" or not ready_only])


@_protocol_errors
async def _infer(request: Request, name: str, version: str | None) -> Response:
    model, codec = inference.find_model(_registry(request), name, version)
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
        raise inference.invalid_request(error) from None
    answer = await inference.infer(
        model,
        codec,
        parsed,
        binary,
        offload if size <= INLINE_BODY_BYTES else functools.partial(parse_off_loop, request, size),
        lambda work, timeout_s: complete(request, work, model.name, timeout_s),
    )
    header = {"model_name": model.name, "model_version": model.entry.version}
    if parsed.id is not None:
        header["id"] = parsed.id
    content, header_length = await offload(encode_response, header, answer.outputs, answer.specs, answer.wanted)
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
