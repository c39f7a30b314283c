"""The Open Inference Protocol's response bodies, for the OpenAPI document (the routes build them by hand)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool


class ProtocolErrorBody(BaseModel):
    """Every error of the protocol's own endpoints (400 bad tensors, 404, 429, 503, 504)."""

    error: str = Field(description="one sentence saying what went wrong")


class ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


class Liveness(BaseModel):
    live: bool


class ServerReadiness(BaseModel):
    ready: bool = Field(description="true with 200; false with 503 (models loading, failed or draining)")


class TensorMetadata(BaseModel):
    name: str
    datatype: str = Field(description="BOOL, INT8 ... INT64, UINT8, FP16, FP32, FP64 or BYTES")
    shape: list[int] = Field(description="-1 = any size")


class ModelMetadata(BaseModel):
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class ModelReadiness(BaseModel):
    name: str
    ready: bool


class ResponseOutput(BaseModel):
    name: str
    datatype: str
    shape: list[int]
    data: list[Any] | None = Field(None, description="row-major elements (absent when sent as binary data)")
    parameters: dict[str, Any] | None = Field(None, description="binary_data_size when sent as binary data")


class InferenceResponse(BaseModel):
    """The JSON body, or with binary outputs the JSON header before the binary tensor data."""

    model_name: str
    model_version: str
    id: str | None = Field(None, description="the request's id, when it had one")
    outputs: list[ResponseOutput]


class RepositoryIndexRequest(BaseModel):
    """The optional body of POST /v2/repository/index."""

    model_config = ConfigDict(extra="forbid")

    ready: StrictBool = Field(False, description="true: only the models that are ready")
