"""The `parameters` of an inference request, its inputs and its outputs: honoured, or refused by name.

Honoured: the binary tensor data extension's `binary_data_output` (request, true/false), `binary_data_size`
(input, checked in tensors.py) and `binary_data` (output, true/false), and Triton's `timeout` (request,
integer microseconds, 0 = none): a deadline shorter than MNEMO_REQUEST_TIMEOUT_S, never longer.
Accepted at their "off" value only: `priority` 0 and `sequence_id` 0 or "" with `sequence_start` and
`sequence_end` false. Accepted and not needed: MLServer's codec hint `content_type` (a string, on the
request, an input or an output), since each tensor's name and datatype already fix how it is read.
Anything else (a sequence, a priority, classification, shared memory, a custom parameter) is a 400
naming it: a client must not believe that a parameter it set was honoured.
"""

from __future__ import annotations

from typing import Any

from app.transports.oip.tensors import InferenceRequest, ProtocolError, json_text

MAX_TIMEOUT_US = 2**63 - 1  # Triton's int64
OFF_VALUES: dict[str, tuple[Any, ...]] = {
    "priority": (0,),
    "sequence_id": (0, ""),
    "sequence_start": (False,),
    "sequence_end": (False,),
}
NOT_OFFERED = {
    "priority": "requests are not prioritised here (the schedule policy extension is not offered); send 0 or "
    "leave it out",
    "sequence_id": "the sequence extension is not offered: each request is independent (a knowledge-tracing "
    "history continues by sending the state output back as the state input)",
    "classification": "the classification extension is not offered",
    "shared_memory_region": "the shared-memory extensions are not offered",
    "shared_memory_byte_size": "the shared-memory extensions are not offered",
    "shared_memory_offset": "the shared-memory extensions are not offered",
}
NOT_OFFERED["sequence_start"] = NOT_OFFERED["sequence_end"] = NOT_OFFERED["sequence_id"]
CODEC_HINT = "content_type"
REQUEST_PARAMETERS = ("timeout", "binary_data_output", CODEC_HINT, *OFF_VALUES)
INPUT_PARAMETERS = ("binary_data_size", CODEC_HINT)
OUTPUT_PARAMETERS = ("binary_data", CODEC_HINT)


def check_parameters(request: InferenceRequest) -> float | None:
    """The deadline in seconds that the request's `timeout` asks for (None: the server's); 400 for any
    parameter not honoured or of the wrong type."""
    _check_known(request.parameters, REQUEST_PARAMETERS, "parameters")
    for name, off in OFF_VALUES.items():
        value = request.parameters.get(name, off[0])
        if not any(type(value) is type(allowed) and value == allowed for allowed in off):
            raise ProtocolError(f"parameters.{name} is {json_text(value)}: {NOT_OFFERED[name]}")
    _check_flag(request.parameters, "binary_data_output", "parameters")
    for index, tensor in enumerate(request.inputs):
        _check_known(tensor.parameters, INPUT_PARAMETERS, f"inputs[{index}].parameters")
    for index, output in enumerate(request.outputs or ()):
        _check_known(output.parameters, OUTPUT_PARAMETERS, f"outputs[{index}].parameters")
        _check_flag(output.parameters, "binary_data", f"outputs[{index}].parameters")
    return _timeout_s(request.parameters.get("timeout"))


def _check_known(parameters: dict[str, Any], known: tuple[str, ...], where: str) -> None:
    for name in parameters:
        if name not in known:
            reason = NOT_OFFERED.get(name, f"not a parameter this server knows; it takes {', '.join(known)}")
            raise ProtocolError(f"{where}.{name[:64]}: {reason}")
    hint = parameters.get(CODEC_HINT, "")
    if not isinstance(hint, str):
        raise ProtocolError(f"{where}.{CODEC_HINT} is {json_text(hint)}; it must be a string")


def _check_flag(parameters: dict[str, Any], name: str, where: str) -> None:
    value = parameters.get(name, False)
    if not isinstance(value, bool):
        raise ProtocolError(f"{where}.{name} is {json_text(value)}; it must be true or false")


def _timeout_s(value: Any) -> float | None:
    """Triton's `timeout`: integer microseconds, 0 for none."""
    if value is None:
        return None
    if type(value) is not int or not 0 <= value <= MAX_TIMEOUT_US:
        raise ProtocolError(
            f"parameters.timeout is {json_text(value)}; it must be an integer count of microseconds "
            f"within 0..{MAX_TIMEOUT_US} (0: the server's deadline)"
        )
    return value / 1e6 if value else None
