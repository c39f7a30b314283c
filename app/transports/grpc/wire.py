"""The gRPC messages of the Open Inference Protocol to and from what app/transports/oip works with.

A `ModelInferRequest` becomes the `InferenceRequest` and binary tensor data that REST's JSON header and body
would carry: `raw_input_contents` (one entry per input, in order, as tritonclient sends them) is the binary
data, each input saying its size as `binary_data_size`; typed `contents` (`int64_contents`, `fp32_contents`,
`bytes_contents`, ...) become the input's `data`. So both transports decode and check tensors with the same
code (oip/tensors.py), and a broken rule is the same sentence. Outputs always go as `raw_output_contents`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message
from pydantic import ValidationError
from tritonclient.grpc import service_pb2

from app.core.errors import ServiceError
from app.runtime.tensors import ProtocolError
from app.transports.oip.inference import Answer, invalid_request
from app.transports.oip.tensors import NUMPY_TYPES, InferenceRequest, tensor_bytes

CONTENTS = {  # the field of InferTensorContents that holds each datatype
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def parameters(message: Mapping[str, service_pb2.InferParameter], where: str) -> dict[str, Any]:
    """A `map<string, InferParameter>` as the values it holds; an unset one is a 400 naming it."""
    values = {}
    for name, parameter in message.items():
        kind = parameter.WhichOneof("parameter_choice")
        if kind is None:
            raise ProtocolError(f"{where}.{name[:64]} holds no value")
        values[name] = getattr(parameter, kind)
    return values


def inference_request(message: service_pb2.ModelInferRequest) -> tuple[InferenceRequest, bytes]:
    """The request as the protocol's `InferenceRequest` and the binary tensor data its inputs claim."""
    raw = message.raw_input_contents
    if raw and len(raw) != len(message.inputs):
        raise ProtocolError(
            f"raw_input_contents has {len(raw)} entries for {len(message.inputs)} inputs: send one per input, in "
            "the order of inputs"
        )
    inputs = []
    for index, tensor in enumerate(message.inputs):
        where = f"inputs[{index}]"
        entry: dict[str, Any] = {
            "name": tensor.name,
            "shape": list(tensor.shape),
            "datatype": tensor.datatype,
            "parameters": parameters(tensor.parameters, f"{where}.parameters"),
        }
        if "binary_data_size" in entry["parameters"]:
            raise ProtocolError(f"{where}.parameters.binary_data_size is REST's; over gRPC send raw_input_contents")
        if raw:
            if tensor.HasField("contents"):
                raise ProtocolError(f"{where} has contents and raw_input_contents; send one of them for every input")
            entry["parameters"]["binary_data_size"] = len(raw[index])
        else:
            entry["data"] = _contents(tensor, where)
        inputs.append(entry)
    try:
        request = InferenceRequest.model_validate(
            {
                "id": message.id or None,
                "parameters": parameters(message.parameters, "parameters"),
                "inputs": inputs,
                "outputs": [
                    {"name": output.name, "parameters": parameters(output.parameters, f"outputs[{index}].parameters")}
                    for index, output in enumerate(message.outputs)
                ],
            }
        )
    except ValidationError as error:
        raise invalid_request(error) from None
    return request, b"".join(raw)


def _contents(tensor: service_pb2.ModelInferRequest.InferInputTensor, where: str) -> list[Any]:
    """The input's typed contents as a flat list; a datatype that has no such field (FP16) needs raw contents."""
    field = CONTENTS.get(tensor.datatype)
    if field is None:
        if tensor.datatype in NUMPY_TYPES:
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


def from_json(document: Mapping[str, Any] | list[Any], message: Message) -> Message:
    """A protocol answer built as JSON (oip/inference.py) read into its gRPC message."""
    try:
        return json_format.ParseDict(document, message)
    except json_format.ParseError as error:  # a bug here, not the client's
        raise ServiceError(f"Could not encode the answer: {error}") from None
