"""The Open Inference Protocol over the task services, whatever carries it (REST routes.py, gRPC app/transports/grpc).

A transport turns its request into an `InferenceRequest` and the binary tensor data that follows it (REST: the
JSON header and the bytes after it; gRPC: the protobuf, its `raw_input_contents` as binary data), then calls
`infer`, which checks the parameters and outputs, decodes the tensors, has the task's codec check them
(`prepare`), admits them in the model's batcher (429) and awaits the answer within the request's deadline (504)
as the transport's `complete` bounds it. The answers of the other endpoints (metadata, Triton's model config,
statistics and repository index) are dicts in the protocol's JSON form; gRPC reads them into its messages.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import ValidationError

from app.runtime.model import ServedModel, TensorCodec
from app.runtime.offload import offload
from app.runtime.registry import ModelRegistry
from app.runtime.tensors import ProtocolError, TensorSpec
from app.transports.oip.parameters import check_parameters
from app.transports.oip.tensors import InferenceRequest, decode_inputs, requested_outputs

# how a transport bounds the work: `complete(work, client_timeout_s)` (deadline, client gone)
Complete = Callable[[Coroutine[Any, Any, Any], float | None], Awaitable[Any]]
# how a transport runs the decoding of `size` bytes of tensors (on a worker thread, or shed)
Decode = Callable[..., Awaitable[dict[str, np.ndarray | None]]]
TRITON_TYPES = {
    "BOOL": "TYPE_BOOL",
    "INT8": "TYPE_INT8",
    "INT16": "TYPE_INT16",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "UINT8": "TYPE_UINT8",
    "FP16": "TYPE_FP16",
    "FP32": "TYPE_FP32",
    "FP64": "TYPE_FP64",
    "BYTES": "TYPE_STRING",
}
EXTENSIONS = ("model_configuration", "statistics")  # Triton's, beside the core protocol, over REST and gRPC
BACKENDS = {"onnxruntime_onnx": "onnxruntime"}  # platforms whose graph the model's tensors are (Triton's backend)


@dataclass(frozen=True)
class Answer:
    """The outputs of an inference and which of them the client asked for (each with whether as binary data)."""

    outputs: Mapping[str, np.ndarray]
    wanted: Mapping[str, bool]
    specs: list[TensorSpec]


def codec_of(registry: ModelRegistry, model: ServedModel) -> TensorCodec | None:
    """The tensor codec of the model's task; None when the task is not served over the protocol."""
    return registry.tasks[model.task].tensors


def invalid_request(error: ValidationError, what: str = "inference request") -> ProtocolError:
    """A request that does not validate, said as its first error with where it is."""
    first = error.errors(include_url=False, include_input=False)[0]
    where = ".".join(str(part) for part in first["loc"]) or "body"
    return ProtocolError(f"invalid {what}: {where}: {first['msg']}")


def find_model(
    registry: ModelRegistry | None, name: str, version: str | None = None
) -> tuple[ServedModel, TensorCodec]:
    """The named model and its task's tensor codec; 404 when unknown (or another version), 503 when not loaded."""
    if registry is None:
        raise ProtocolError("Models are still loading.", 503)
    model = registry.models.get(name)
    codec = None if model is None else codec_of(registry, model)
    if codec is None:
        known = ", ".join(sorted(n for n, m in registry.models.items() if codec_of(registry, m))) or "none"
        raise ProtocolError(f"Unknown model {name[:100]!r}; available: {known}.", 404)
    if version and version != model.entry.version:
        raise ProtocolError(f"Model {name} has no version {version[:40]!r}; it serves {model.entry.version}.", 404)
    if not model.ready:
        raise ProtocolError(f"Model {name} is not ready: {model.error}", 503)
    return model, codec


async def infer(
    model: ServedModel,
    codec: TensorCodec,
    request: InferenceRequest,
    binary: bytes,
    decode: Decode,
    complete: Complete,
) -> Answer:
    """Run the model on the request's tensors, admitted by its batcher and bounded by `complete`.

    `decode(decode_inputs, request, binary, specs)` runs the decoding where the transport wants it."""
    timeout_s = check_parameters(request)
    wanted = requested_outputs(request, codec.outputs(model))
    tensors = await decode(decode_inputs, request, binary, codec.inputs(model))
    prepared = await offload(codec.prepare, model, tensors)
    with model.batcher.admit(prepared.rows, prepared.cells):
        outputs = await complete(codec.infer(model, prepared), timeout_s)
    return Answer(outputs, wanted, codec.outputs(model))


def metadata(model: ServedModel, codec: TensorCodec) -> dict[str, Any]:
    """The model's inputs and outputs (name, datatype, shape; -1 = any size) and its platform."""
    return {
        "name": model.name,
        "versions": [model.entry.version],
        "platform": codec.PLATFORM,
        "inputs": [spec.metadata() for spec in codec.inputs(model)],
        "outputs": [spec.metadata() for spec in codec.outputs(model)],
    }


def model_config(model: ServedModel, codec: TensorCodec) -> dict[str, Any]:
    """Triton's model configuration (its JSON form): every tensor is batch-first, so `max_batch_size` is the rows
    of one run (MNEMO_MAX_BATCH or the manifest's) and `dims` leave the batch dimension out (-1: any size); the
    dynamic batching in force (the longest wait to fill a batch, the queue's bound, the request deadline)."""
    config = model.batcher.config
    platform = codec.PLATFORM
    return {
        "name": model.name,
        "platform": platform,
        "backend": BACKENDS.get(platform, platform),
        "max_batch_size": config.max_batch,
        "input": [_tensor_config(spec) for spec in codec.inputs(model)],
        "output": [_tensor_config(spec) for spec in codec.outputs(model)],
        "dynamic_batching": {
            "max_queue_delay_microseconds": round(config.max_wait_s * 1e6),
            "default_queue_policy": {
                "timeout_action": "REJECT",
                "default_timeout_microseconds": round(config.deadline_s * 1e6),
                "allow_timeout_override": True,
                "max_queue_size": config.max_queue,
            },
        },
    }


def _tensor_config(spec: TensorSpec) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": spec.name, "data_type": TRITON_TYPES[spec.datatype], "dims": list(spec.shape[1:])}
    if spec.optional:
        entry["optional"] = True
    return entry


def statistics(registry: ModelRegistry | None, name: str = "", version: str = "") -> dict[str, Any]:
    """Triton's statistics extension for one model (`name`) or every model served over the protocol."""
    if name:
        models = [find_model(registry, name, version)[0]]
    elif registry is None:
        models = []
    else:
        models = [model for model in registry.models.values() if codec_of(registry, model) and model.ready]
    return {
        "model_stats": [
            {"name": model.name, "version": model.entry.version, **model.batcher.stats.snapshot()} for model in models
        ]
    }


def repository_index(registry: ModelRegistry | None) -> list[dict[str, str]]:
    """Every model served over the protocol with its state: READY, or UNAVAILABLE with the reason."""
    if registry is None:
        return []
    index = []
    for model in sorted(registry.models.values(), key=lambda model: model.name):
        if codec_of(registry, model) is None:
            continue
        entry = {"name": model.name, "version": model.entry.version, "state": "READY" if model.ready else "UNAVAILABLE"}
        entry["reason"] = "" if model.ready else str(model.error or "not loaded")
        index.append(entry)
    return index
