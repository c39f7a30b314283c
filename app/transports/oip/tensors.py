"""Open Inference Protocol tensors: the request, its JSON and binary tensor data decoded (each input checked against
the model's `TensorSpec`, a `ProtocolError` naming it), and REST's answer encoded."""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, Field, StrictInt
from starlette.responses import Response
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor, triton_to_np_dtype

from app.core.errors import InvalidInput, printable
from app.core.responses import dumps
from app.runtime.model import ProtocolError, ServedModel, TensorSpec
from app.transports.http import Body, validate

MAX_RANK = 8
MAX_DIM = 2**31 - 1  # larger dims are refused: numpy cannot even describe an empty [2**62, 0] array
# the JSON types each datatype's elements may have (the others: int or float)
JSON_TYPES = {"BOOL": (bool,), "BYTES": (str,)} | dict.fromkeys(("INT8", "INT16", "INT32", "INT64", "UINT8"), (int,))
Output = tuple[str, str, np.ndarray, bool]  # a requested output: name, datatype, array, whether as binary data


class RequestInput(BaseModel):
    name: str = Field(max_length=128)
    shape: list[Annotated[StrictInt, Field(ge=-MAX_DIM, le=MAX_DIM)]] = Field(max_length=MAX_RANK)
    datatype: str = Field(max_length=16)
    parameters: dict[str, Any] = Field(default_factory=dict)
    data: list[Any] | None = None


class RequestOutput(BaseModel):
    name: str = Field(max_length=128)
    parameters: dict[str, Any] = Field(default_factory=dict)


class InferenceRequest(BaseModel):
    """The JSON body (or header) of POST /v2/models/{name}/infer."""

    id: str | None = Field(default=None, max_length=256)
    parameters: dict[str, Any] = Field(default_factory=dict)
    inputs: list[RequestInput] = Field(min_length=1, max_length=64)
    outputs: list[RequestOutput] | None = Field(default=None, max_length=64)


def parse_request(
    body: bytes | dict[str, Any], schema: type[Body] = InferenceRequest, what: str = "inference request"
) -> Body:
    """`schema` from its JSON text (REST) or its fields (gRPC), as REST's `validate`; a 400 naming the first error."""
    try:
        return validate(schema, body)
    except InvalidInput as error:
        where = ".".join(map(str, error.location[1:])) or "body"
        raise ProtocolError(f"invalid {what}: {where}: {error.message}") from None


def decode_inputs(
    request: InferenceRequest, binary: bytes, specs: Sequence[TensorSpec]
) -> dict[str, np.ndarray | None]:
    """Every declared input as a numpy array of its datatype and shape (None for an absent optional one)."""
    declared = {spec.name: spec for spec in specs}
    arrays: dict[str, np.ndarray | None] = dict.fromkeys(declared)
    offset = 0
    for tensor in request.inputs:
        if (spec := declared.get(tensor.name)) is None:
            raise ProtocolError(f"unknown input {tensor.name!r}; the model takes {', '.join(declared)}")
        if arrays[tensor.name] is not None:
            raise ProtocolError(f"input {tensor.name} is given twice")
        if tensor.datatype != spec.datatype:
            raise ProtocolError(
                f"input {tensor.name} has datatype {printable(tensor.datatype)}; the model expects {spec.datatype}"
            )
        wrong_dim = any(got < 0 or got != want >= 0 for got, want in zip(tensor.shape, spec.shape, strict=False))
        if wrong_dim or len(tensor.shape) != len(spec.shape):
            raise ProtocolError(
                f"input {tensor.name} has shape {tensor.shape}; the model expects {list(spec.shape)} (-1: any)"
            )
        size = tensor.parameters.get("binary_data_size")
        if (size is None) == (tensor.data is None):
            given = "neither data nor" if size is None else "both data and"
            raise ProtocolError(f"input {tensor.name} has {given} binary_data_size; send one of them")
        if size is None:
            arrays[tensor.name] = _from_json(tensor, tensor.data)
            continue
        if type(size) is not int or size < 0:
            raise ProtocolError(f"input {tensor.name}: binary_data_size {json_text(size)} must be a count of bytes")
        if size and not binary:
            raise ProtocolError(
                f"input {tensor.name} has binary_data_size but the request has no binary data: send the "
                "Inference-Header-Content-Length header (the JSON header's length in bytes) and the data after it"
            )
        if offset + size > len(binary):
            raise ProtocolError(f"input {tensor.name}: binary_data_size {json_text(size)} does not fit the binary data")
        arrays[tensor.name] = _from_binary(tensor, binary[offset : offset + size])
        offset += size
    if offset != len(binary):
        raise ProtocolError(f"{len(binary) - offset} bytes of binary data are not claimed by any input")
    if missing := [name for name, array in arrays.items() if array is None and not declared[name].optional]:
        raise ProtocolError(f"missing input(s) {', '.join(missing)}; the model takes {', '.join(declared)}")
    return arrays


def _from_json(tensor: RequestInput, elements: list[Any]) -> np.ndarray:
    """The elements (JSON `data` or BYTES binary data), flat or nested as the shape, as an array of the datatype."""
    count = math.prod(tensor.shape)
    if any(isinstance(element, list) for element in elements):
        nested = np.array(elements, dtype=object)  # ragged lists stay lists: the shape is where they begin
        if nested.shape != tuple(tensor.shape):
            raise ProtocolError(f"input {tensor.name}: nested data must follow the shape {tensor.shape}, or be flat")
        elements = nested.ravel().tolist()
    if len(elements) != count:
        raise ProtocolError(
            f"input {tensor.name}: shape {tensor.shape} needs {count} elements, "
            f"{'data' if tensor.data is not None else 'the binary data'} has {len(elements)}"
        )
    accepted = JSON_TYPES.get(tensor.datatype, (int, float))
    wrong = next((index for index, element in enumerate(elements) if type(element) not in accepted), None)
    if wrong is not None:
        what = {(bool,): "true or false", (int,): "integers", (str,): "strings"}.get(accepted, "numbers")
        raise ProtocolError(
            f"input {tensor.name}: element {wrong} is {json_text(elements[wrong])}; {tensor.datatype} data must be "
            f"JSON {what}"
        )
    dtype = triton_to_np_dtype(tensor.datatype)
    try:
        with np.errstate(over="raise"):  # a finite number past the datatype's range (1e39 as FP32) is refused
            return np.array(elements, dtype=dtype).reshape(tensor.shape)
    except (OverflowError, FloatingPointError):  # numpy names no element
        limits = np.iinfo(dtype) if accepted == (int,) else np.finfo(dtype)
        # as Python numbers, which compare with any int exactly (numpy's float32 would overflow on 10**400)
        low, high = (limits.min, limits.max) if accepted == (int,) else (-float(limits.max), float(limits.max))
        index = next(index for index, element in enumerate(elements) if not low <= element <= high)
        raise ProtocolError(
            f"input {tensor.name}: element {index} is {json_text(elements[index])}; "
            f"{tensor.datatype} holds {limits.min!s}..{limits.max!s}"
        ) from None


def json_text(value: Any) -> str:
    """A JSON value as the client wrote it (NaN and Infinity too), cut to 40 characters; a huge integer by its size."""
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**64:
        return f"an integer of about {math.ceil(value.bit_length() * math.log10(2))} digits"
    return printable(json.dumps(value, ensure_ascii=False, separators=(",", ":")), 40)  # orjson: no NaN or 2**64


def _from_binary(tensor: RequestInput, raw: bytes) -> np.ndarray:
    if tensor.datatype == "BYTES":
        try:
            elements = deserialize_bytes_tensor(raw)
        except struct.error:
            raise ProtocolError(
                f"input {tensor.name}: truncated BYTES element (each is a 4-byte little-endian length, then that "
                "many bytes)"
            ) from None
        return _from_json(tensor, utf8_texts(elements, f"input {tensor.name}"))
    dtype, count = np.dtype(triton_to_np_dtype(tensor.datatype)).newbyteorder("<"), math.prod(tensor.shape)
    if len(raw) != count * dtype.itemsize:
        raise ProtocolError(
            f"input {tensor.name}: shape {tensor.shape} needs {count * dtype.itemsize} bytes, got {len(raw)}"
        )
    return np.frombuffer(raw, dtype=dtype).astype(dtype.newbyteorder("=")).reshape(tensor.shape)


def utf8_texts(elements: Sequence[bytes], where: str) -> list[str]:
    """BYTES elements as text; 400 naming the first that is not UTF-8."""
    texts = []
    for index, element in enumerate(elements):
        try:
            texts.append(element.decode("utf-8"))
        except UnicodeDecodeError:
            raise ProtocolError(f"{where}: BYTES element {index} is not UTF-8 text") from None
    return texts


def requested_outputs(request: InferenceRequest, specs: Sequence[TensorSpec]) -> list[tuple[TensorSpec, bool]]:
    """The outputs to return (all when `outputs` is absent or empty), each with whether it goes as binary data."""
    declared = {spec.name: spec for spec in specs}
    everything_binary = request.parameters.get("binary_data_output") is True
    wanted: dict[str, tuple[TensorSpec, bool]] = {}
    for output in request.outputs or [RequestOutput(name=name) for name in declared]:
        if output.name not in declared:
            raise ProtocolError(f"unknown output {output.name!r}; the model returns {', '.join(declared)}")
        if output.name in wanted:
            raise ProtocolError(f"output {output.name} is requested twice")
        wanted[output.name] = declared[output.name], output.parameters.get("binary_data", everything_binary) is True
    return list(wanted.values())


def encode_response(model: ServedModel, request: InferenceRequest, outputs: Sequence[Output]) -> Response:
    """The JSON answer, or with binary outputs its JSON header (`Inference-Header-Content-Length` bytes) then theirs."""
    tensors, blobs = [], []
    for name, datatype, array, binary in outputs:
        tensor: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if binary:
            blobs.append(tensor_bytes(array, datatype))
            tensor["parameters"] = {"binary_data_size": len(blobs[-1])}
        else:
            tensor["data"] = array.ravel().tolist() if datatype == "BYTES" else array.ravel()
        tensors.append(tensor)
    answer = {"model_name": model.name, "model_version": model.entry.version, "id": request.id, "outputs": tensors}
    body = dumps({key: value for key, value in answer.items() if value is not None})
    if not blobs:
        return Response(body, media_type="application/json")
    headers = {"Inference-Header-Content-Length": str(len(body))}
    return Response(body + b"".join(blobs), media_type="application/octet-stream", headers=headers)


def tensor_bytes(array: np.ndarray, datatype: str) -> bytes:
    """The tensor's raw bytes as the protocol sends them: little-endian, BYTES as 4-byte lengths and the bytes."""
    if datatype == "BYTES":
        return b"".join(serialize_byte_tensor(array).ravel())
    return np.ascontiguousarray(array, dtype=np.dtype(triton_to_np_dtype(datatype)).newbyteorder("<")).tobytes()
