"""The Open Inference Protocol (KServe v2) REST endpoints, with Triton's model config, statistics and repository
index; a model's routes also answer under `/versions/{version}`; errors are shaped by error_handlers.py."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from pydantic import ConfigDict, Field, StrictBool, create_model
from starlette.datastructures import State
from starlette.responses import Response

from app.core.responses import JsonResponse
from app.transports.access import BINARY_HEADER_LENGTH
from app.transports.http import json_body, utf8_body
from app.transports.oip import inference
from app.transports.oip.tensors import InferenceRequest, ProtocolError, encode_response, parse_request
from app.transports.operations import readiness

READY = "true with 200; false with 503 (models loading, failed or draining)"
ServerMetadata = create_model("ServerMetadata", name=str, version=str, extensions=list[str])
Liveness = create_model("Liveness", live=bool)
ServerReadiness = create_model("ServerReadiness", ready=(bool, Field(description=READY)))
ModelReadiness = create_model("ModelReadiness", name=str, ready=bool)
TensorMetadata = create_model(
    "TensorMetadata",
    name=str,
    datatype=(str, Field(description="BOOL, INT8 ... INT64, UINT8, FP16, FP32, FP64 or BYTES")),
    shape=(list[int], Field(description="-1 = any size")),
)
Tensors = list[TensorMetadata]
ModelMetadata = create_model(
    "ModelMetadata", name=str, versions=list[str], platform=str, inputs=Tensors, outputs=Tensors
)
ResponseOutput = create_model(
    "ResponseOutput",
    name=str,
    datatype=str,
    shape=list[int],
    data=(list[Any] | None, Field(None, description="row-major elements (absent when sent as binary data)")),
    parameters=(dict[str, Any] | None, Field(None, description="binary_data_size when sent as binary data")),
)
InferenceResponse = create_model(
    "InferenceResponse",
    __doc__="The JSON body, or with binary outputs the JSON header before the binary tensor data.",
    model_name=str,
    model_version=str,
    id=(str | None, Field(None, description="the request's id, when it had one")),
    outputs=list[ResponseOutput],
)
RepositoryIndexRequest = create_model(
    "RepositoryIndexRequest",
    __config__=ConfigDict(extra="forbid"),
    ready=(StrictBool, Field(False, description="true: only the models that are ready")),
)
HEADER_LENGTH_VALUE = re.compile(r"[0-9]{1,15}")  # ASCII digits only: int() would also take "²" or 5,000 digits
router = APIRouter(prefix="/v2", tags=["open inference protocol"])


def model_route(path: str, answer: Callable[[State, str, str | None], dict], **documented: Any) -> None:
    """GET `/models/{name}<path>` (and `/models/{name}/versions/{version}<path>`): `answer`'s dict, shared with gRPC."""

    async def handler(request: Request, name: str) -> Response:
        return JsonResponse(answer(request.app.state, name, request.path_params.get("version")))

    handler.__name__, handler.__doc__ = answer.__name__, answer.__doc__  # the operation's summary and text
    router.get(f"/models/{{name}}{path}", **documented)(handler)
    router.get(f"/models/{{name}}/versions/{{version}}{path}", include_in_schema=False)(handler)


@router.get("", operation_id="oip_server_metadata", response_model=ServerMetadata)
async def server_metadata(request: Request) -> JsonResponse:
    """Server name, version and protocol extensions."""
    extensions = ["binary_tensor_data", *inference.EXTENSIONS]
    return JsonResponse({"name": request.app.title, "version": request.app.version, "extensions": extensions})


@router.get("/health/live", operation_id="oip_live", response_model=Liveness)
async def live() -> JsonResponse:
    """200 while the process is up."""
    return JsonResponse({"live": True})


@router.get("/health/ready", operation_id="oip_ready", response_model=ServerReadiness)
async def ready(request: Request) -> JsonResponse:
    """200 when every model is loaded and the server is not draining; else 503."""
    status, _ = readiness(request.app.state)
    return JsonResponse({"ready": status == 200}, status)


@router.get("/models/stats", operation_id="oip_statistics")
async def all_statistics(request: Request) -> Response:
    """Triton's statistics extension for every model (success and failure counts, durations in ns, inference and
    execution counts) from each model's batcher in this worker."""
    return JsonResponse(inference.model_statistics(request.app.state))


# after /models/stats, which the first would take for a model
model_route("", inference.model_metadata, operation_id="oip_model_metadata", response_model=ModelMetadata)
model_route("/ready", inference.model_ready, operation_id="oip_model_ready", response_model=ModelReadiness)
model_route("/config", inference.model_config, operation_id="oip_model_config")
model_route("/stats", inference.model_statistics, operation_id="oip_model_statistics")


@router.post("/repository/index", operation_id="oip_repository_index")
async def repository_index(request: Request) -> Response:
    """Triton's repository index: every model with its state (READY, or UNAVAILABLE with the reason); the body
    `{"ready": true}` (optional) lists the ready ones only."""
    index = parse_request(await request.body() or b"{}", RepositoryIndexRequest, "repository index request")
    return JsonResponse(inference.repository_index(request.app.state, index.ready))


@router.post(
    "/models/{name}/infer",
    operation_id="oip_infer",
    response_model=InferenceResponse,
    responses={200: {"content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}},
    openapi_extra=json_body(InferenceRequest),
)
@router.post("/models/{name}/versions/{version}/infer", include_in_schema=False)
async def infer(request: Request, name: str) -> Response:
    """Run the model on the request's tensors (JSON, or binary tensor data); with binary outputs the answer is
    application/octet-stream: its JSON header (`Inference-Header-Content-Length` bytes), then the tensors' bytes."""
    state = request.app.state
    model, codec = inference.find_model(state, name, request.path_params.get("version"))
    body, length = await utf8_body(request), request.headers.get(BINARY_HEADER_LENGTH)
    if length is not None and (HEADER_LENGTH_VALUE.fullmatch(length) is None or int(length) > len(body)):
        raise ProtocolError(
            f"Inference-Header-Content-Length {length[:20]!r} does not fit the body of {len(body)} bytes: "
            "it must be the JSON header's length in bytes (ASCII digits)"
        )
    header, binary = (body, b"") if length is None else (body[: int(length)], body[int(length) :])
    return await inference.infer(
        state, model, codec, len(body), lambda: (parse_request(header), binary), encode_response, request.receive
    )
