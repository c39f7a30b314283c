"""The Open Inference Protocol's data plane over the task services, for REST (routes.py) and gRPC alike: `infer`
runs a request between the transport's decode and encode; the other answers are dicts in the protocol's JSON form."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from starlette.datastructures import State
from starlette.types import Receive

from app.core.errors import ModelNotReady, UnknownModel, printable
from app.runtime.model import Admission, ProtocolError, ServedModel, TensorCodec, TensorSpec
from app.runtime.offload import ParseQueueFull, offload_if, offload_or_shed
from app.transports.deadline import within_deadline
from app.transports.oip.tensors import InferenceRequest, Output, decode_inputs, json_text, requested_outputs

INLINE_BYTES = 8192  # smaller requests and answers are decoded and encoded on the event loop: no thread hop
T = TypeVar("T")
EXTENSIONS = ("model_configuration", "statistics")  # Triton's, beside the core protocol, over REST and gRPC
BACKENDS = {"onnxruntime_onnx": "onnxruntime"}  # platforms whose graph the model's tensors are (Triton's backend)
MAX_TIMEOUT_US = 2**63 - 1  # Triton's int64
# Parameters are honoured, accepted at their "off" value only, or accepted and not needed (MLServer's codec hint
# `content_type`); anything else is a 400 naming it, never silently ignored.
OFF_VALUES = {"priority": (0,), "sequence_id": (0, ""), "sequence_start": (False,), "sequence_end": (False,)}
SEQUENCES = (
    "the sequence extension is not offered: each request is independent (a knowledge-tracing history continues "
    "by sending the state output back as the state input)"
)
SHARED_MEMORY = "the shared-memory extensions are not offered"
NOT_OFFERED = {
    "priority": "requests are not prioritised here (the schedule policy extension is not offered); send 0 or "
    "leave it out",
    **dict.fromkeys(("sequence_id", "sequence_start", "sequence_end"), SEQUENCES),
    "classification": "the classification extension is not offered",
    **dict.fromkeys(("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset"), SHARED_MEMORY),
}
CODEC_HINT = "content_type"
TYPED = {CODEC_HINT: (str, "a string"), **dict.fromkeys(("binary_data", "binary_data_output"), (bool, "true or false"))}


def served(state: State) -> list[ServedModel]:
    """The models whose task has a tensor codec (those the protocol serves)."""
    registry = getattr(state, "registry", None)
    return [m for m in registry.models.values() if registry.tasks[m.task].tensors] if registry else []


def find_model(state: State, name: str, version: str | None = None) -> tuple[ServedModel, TensorCodec]:
    """The named model and its task's tensor codec; 404 when unknown (or another version), 503 when not loaded."""
    if (registry := getattr(state, "registry", None)) is None:
        raise ModelNotReady("Models are still loading.")
    model = registry.models.get(name)
    codec = None if model is None else registry.tasks[model.task].tensors
    if codec is None:
        known = ", ".join(sorted(m.name for m in served(state))) or "none"
        raise UnknownModel(f"Unknown model {name[:100]!r}; available: {known}.")
    if version and version != model.entry.version:
        raise UnknownModel(f"Model {name} has no version {version[:40]!r}; it serves {model.entry.version}.")
    if not model.ready:
        raise ModelNotReady(f"Model {name} is not ready: {model.error}")
    return model, codec


async def infer(
    state: State,
    model: ServedModel,
    codec: TensorCodec,
    size: int,
    decode: Callable[[], tuple[InferenceRequest, bytes]],
    encode: Callable[[ServedModel, InferenceRequest, list[Output]], T],
    receive: Receive | None = None,
    rpc_timeout_s: float | None = None,
) -> T:
    """`encode`'s answer to `decode()`'s request and binary data, within the server's deadline or a shorter `timeout` or
    gRPC deadline; past INLINE_BYTES, decoding and encoding run on the bounded parse queue's threads (429 when full)."""

    def prepare() -> tuple[InferenceRequest, float | None, list[tuple[TensorSpec, bool]], Admission, Any]:
        request, binary = decode()
        timeout_s, wanted = check_parameters(request), requested_outputs(request, codec.outputs(model))
        return request, timeout_s, wanted, *codec.prepare(model, decode_inputs(request, binary, codec.inputs(model)))

    try:
        request, timeout_s, wanted, admission, prepared = (
            prepare() if size <= INLINE_BYTES else await offload_or_shed(size, prepare)
        )
    except ParseQueueFull:
        state.metrics.refused("parse_queue_full")
        raise
    source = "the request's timeout parameter"
    if rpc_timeout_s is not None and (timeout_s is None or rpc_timeout_s < timeout_s):
        timeout_s, source = rpc_timeout_s, "the gRPC deadline"
    with admission:
        arrays = await within_deadline(codec.infer(model, prepared), state, model.name, timeout_s, source, receive)
    outputs = [(spec.name, spec.datatype, arrays[spec.name], binary) for spec, binary in wanted]
    large = sum(array.nbytes for _, _, array, _ in outputs) > INLINE_BYTES
    return await offload_if(large, encode, model, request, outputs)


def check_parameters(request: InferenceRequest) -> float | None:
    """The `timeout` parameter's deadline in seconds (None: the server's); 400 for a bad or unhonoured parameter."""
    _check_known(request.parameters, "parameters", ("timeout", "binary_data_output", CODEC_HINT, *OFF_VALUES))
    for name, off in OFF_VALUES.items():
        value = request.parameters.get(name, off[0])
        if not any(type(value) is type(allowed) and value == allowed for allowed in off):
            raise ProtocolError(f"parameters.{name} is {json_text(value)}: {NOT_OFFERED[name]}")
    for index, tensor in enumerate(request.inputs):
        _check_known(tensor.parameters, f"inputs[{index}].parameters", ("binary_data_size", CODEC_HINT))
    for index, output in enumerate(request.outputs or ()):
        _check_known(output.parameters, f"outputs[{index}].parameters", ("binary_data", CODEC_HINT))
    timeout = request.parameters.get("timeout")  # Triton's: integer microseconds, 0 for none
    if timeout is not None and (type(timeout) is not int or not 0 <= timeout <= MAX_TIMEOUT_US):
        raise ProtocolError(
            f"parameters.timeout is {json_text(timeout)}; it must be an integer count of microseconds "
            f"within 0..{MAX_TIMEOUT_US} (0: the server's deadline)"
        )
    return timeout / 1e6 if timeout else None


def _check_known(parameters: dict[str, Any], where: str, known: tuple[str, ...]) -> None:
    """400 for a parameter not in `known`, or a codec hint or binary flag of the wrong type."""
    for name in parameters:
        if name not in known:
            reason = NOT_OFFERED.get(name, f"not a parameter this server knows; it takes {', '.join(known)}")
            raise ProtocolError(f"{where}.{printable(name, 64)}: {reason}")
    for name, (kind, what) in TYPED.items():
        if name in parameters and not isinstance(parameters[name], kind):
            raise ProtocolError(f"{where}.{name} is {json_text(parameters[name])}; it must be {what}")


def model_metadata(state: State, name: str, version: str | None = None) -> dict[str, Any]:
    """The model's inputs and outputs (name, datatype, shape; -1 = any size) and its platform."""
    model, codec = find_model(state, name, version)
    return {
        "name": model.name,
        "versions": [model.entry.version],
        "platform": codec.PLATFORM,
        "inputs": [spec.metadata() for spec in codec.inputs(model)],
        "outputs": [spec.metadata() for spec in codec.outputs(model)],
    }


def model_ready(state: State, name: str, version: str | None = None) -> dict[str, Any]:
    """200 when the model is loaded, 404 when unknown, 503 when it failed to load."""
    return {"name": find_model(state, name, version)[0].name, "ready": True}


def model_config(state: State, name: str, version: str | None = None) -> dict[str, Any]:
    """Triton's model configuration: inputs, outputs (dims less the batch one; -1: any), max_batch_size, batching."""
    model, codec = find_model(state, name, version)
    config = model.batcher.config

    def tensor(spec: TensorSpec) -> dict[str, Any]:
        data_type = "TYPE_STRING" if spec.datatype == "BYTES" else f"TYPE_{spec.datatype}"
        optional = {"optional": True} if spec.optional else {}
        return {"name": spec.name, "data_type": data_type, "dims": list(spec.shape[1:]), **optional}

    return {
        "name": model.name,
        "platform": codec.PLATFORM,
        "backend": BACKENDS.get(codec.PLATFORM, codec.PLATFORM),
        "max_batch_size": config.max_batch,
        "input": [tensor(spec) for spec in codec.inputs(model)],
        "output": [tensor(spec) for spec in codec.outputs(model)],
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


def model_statistics(state: State, name: str = "", version: str | None = None) -> dict[str, Any]:
    """Triton's statistics extension for one model (`name`) or every ready one."""
    if version and not name:  # gRPC's request may carry one: it would be ignored
        raise ProtocolError(f"version {version[:40]!r} names no model: send the model's name too, or no version")
    models = [find_model(state, name, version)[0]] if name else [m for m in served(state) if m.ready]
    stats = [{"name": model.name, "version": model.entry.version, **model.batcher.stats.snapshot()} for model in models]
    return {"model_stats": stats}


def repository_index(state: State, ready_only: bool = False, repository: str = "") -> list[dict[str, str]]:
    """Every model served over the protocol with its state: READY, or UNAVAILABLE with the reason."""
    if repository:  # gRPC's request may name one
        raise ProtocolError(f"repository_name {repository[:64]!r}: this server has one repository; leave it empty")
    return [
        {
            "name": model.name,
            "version": model.entry.version,
            "state": "READY" if model.ready else "UNAVAILABLE",
            "reason": "" if model.ready else str(model.error or "not loaded"),
        }
        for model in sorted(served(state), key=lambda model: model.name)
        if model.ready or not ready_only
    ]
