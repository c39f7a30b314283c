"""The tensor vocabulary shared by the tasks' tensor codecs (`TensorCodec`) and the Open Inference Protocol
transport: declared inputs and outputs (`TensorSpec`), and the refusal of a request (`ProtocolError`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# ONNX tensor element types: the protocol's datatype, and the numpy dtype of a fixed-size element
ONNX_TYPES: dict[str, tuple[str, type[np.generic] | None]] = {
    "tensor(bool)": ("BOOL", np.bool_),
    "tensor(int8)": ("INT8", np.int8),
    "tensor(int16)": ("INT16", np.int16),
    "tensor(int32)": ("INT32", np.int32),
    "tensor(int64)": ("INT64", np.int64),
    "tensor(uint8)": ("UINT8", np.uint8),
    "tensor(float16)": ("FP16", np.float16),
    "tensor(float)": ("FP32", np.float32),
    "tensor(double)": ("FP64", np.float64),
    "tensor(string)": ("BYTES", None),
}


class ProtocolError(Exception):
    """A request the protocol adapter refuses: `{"error": message}` with `status` (400 unless said)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message, self.status = message, status


@dataclass(frozen=True)
class TensorSpec:
    """A declared input or output: name, datatype and shape (-1 = any size)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    optional: bool = False

    def metadata(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


def onnx_spec(name: str, onnx_type: str, shape: Sequence[int | str | None]) -> TensorSpec:
    """The protocol's view of an ONNX graph input or output: symbolic dims become -1."""
    datatype, _ = ONNX_TYPES.get(onnx_type, (None, None))
    if datatype is None:
        raise ValueError(f"graph tensor {name} has type {onnx_type}, which the protocol adapter does not map")
    return TensorSpec(name, datatype, tuple(dim if isinstance(dim, int) and dim >= 0 else -1 for dim in shape))
