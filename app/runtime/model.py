"""`ServedModel`, the `Task` protocol a task family meets, and its codecs' vocabulary (`Endpoint`, `TensorSpec`...)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np
import onnxruntime as ort
from fastapi import APIRouter
from pydantic import BaseModel

from app.core.errors import ServiceError
from app.core.manifest import ModelEntry
from app.runtime.collate import Feeds

if TYPE_CHECKING:
    from app.runtime.batcher import ModelBatcher
    from app.runtime.instances import Instance

# ONNX tensor element types as the protocol's datatypes (numpy's dtype of each: tritonclient's triton_to_np_dtype)
ONNX_TYPES = {"tensor(float16)": "FP16", "tensor(float)": "FP32", "tensor(double)": "FP64", "tensor(string)": "BYTES"}
ONNX_TYPES |= {f"tensor({name})": name.upper() for name in ("bool", "int8", "int16", "int32", "int64", "uint8")}
Admission = AbstractContextManager[None]  # the room a request holds in a batcher while handled: its ModelBatcher.admit


class ProtocolError(ServiceError):
    status_code = 400  # a request the protocol adapter refuses, answered `{"error": detail}`


class TensorSpec(NamedTuple):
    """A declared input or output: name, datatype and shape (-1 = any size)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    optional: bool = False

    def metadata(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


def onnx_spec(node: ort.NodeArg, optional: bool = False) -> TensorSpec:
    """The protocol's view of an ONNX graph input or output: symbolic (or zero) dims become -1."""
    if node.type not in ONNX_TYPES:
        raise ValueError(f"graph tensor {node.name} has type {node.type}, which the protocol adapter does not map")
    shape = tuple(dim if isinstance(dim, int) and dim > 0 else -1 for dim in node.shape)
    return TensorSpec(node.name, ONNX_TYPES[node.type], shape, optional)


class GraphLayout(NamedTuple):
    """One graph's sequence inputs (padded along axis 1 in a batch) and outputs (trimmed back by that padding)."""

    sequence_inputs: tuple[str, ...] = ()
    sequence_outputs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Endpoint:
    """One POST endpoint of a task's JSON API: the body validated as `request`, admitted as `admit` says, answered by
    `answer(model, body, alone)` within the deadline (`alone`: no other request, so it may run inline)."""

    path: str
    operation_id: str  # also the route's name
    request: type[BaseModel]
    response: type[BaseModel]
    description: str
    admit: Callable[[ServedModel, Any], Admission]
    answer: Callable[[ServedModel, Any, bool], Awaitable[bytes]]
    reserve: bool = True  # a large body holds room in its model's batcher while parsed (False: another graph's)


class TensorCodec(Protocol):
    """What a task provides to serve its models over a tensor protocol."""

    PLATFORM: str
    inputs: Callable[[ServedModel], list[TensorSpec]]
    outputs: Callable[[ServedModel], list[TensorSpec]]
    # the room the request takes (not yet held) and the checked request (blocking, on a worker thread)
    prepare: Callable[[ServedModel, dict[str, np.ndarray | None]], tuple[Admission, Any]]
    infer: Callable[[ServedModel, Any], Awaitable[Feeds]]


class Task(Protocol):
    """A task family: its service's hooks, and the codecs each transport needs."""

    name: str
    tag: str  # the OpenAPI tag of its endpoints
    endpoints: Sequence[Endpoint]  # the JSON POST endpoints (app/transports/http.py)
    routes: APIRouter  # its other REST routes, which need none of the transport's machinery
    tensors: TensorCodec | None  # its Open Inference Protocol codec, if it has one
    graphs: Collection[str]  # the extra graphs of the same weights a model may carry (manifest `graphs`)
    prepare: Callable[[ServedModel], Any]  # checks a loaded model's metadata, limits and assets: its typed `state`
    describe: Callable[[ServedModel], dict[str, Any]]  # the task's own fields in GET /models


@dataclass
class ServedModel:
    """One manifest entry and, once loaded, its sessions, assets, task state, batcher and extra graphs."""

    entry: ModelEntry
    assets: dict[str, np.ndarray] = field(default_factory=dict)
    state: Any = None
    error: str | None = None
    instances: list[Instance] = field(default_factory=list)  # one session per MNEMO_PROVIDER entry
    session: ort.InferenceSession | None = None  # the first instance's: all have the same inputs and outputs
    graphs: dict[str, ServedModel] = field(default_factory=dict)
    batcher: ModelBatcher | None = None  # set while ModelRegistry.serve runs

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def task(self) -> str:
        return self.entry.task

    @property
    def ready(self) -> bool:
        return bool(self.instances) and self.error is None

    def public_info(self, task: Task | None) -> dict[str, Any]:
        """What GET /models reports (file names only, never server paths)."""
        info = self.entry.model_dump(include={"name", "task", "version", "sha256"})
        info |= {"provider": self.instances[0].provider if self.instances else None, "default": self.entry.default}
        info |= {"ready": self.ready, **self.entry.model_dump(include={"limits", "metrics", "metadata", "card"})}
        if config := self.batcher and self.batcher.config:
            info["batching"] = {"max_batch": config.max_batch, "max_wait_ms": config.max_wait_s * 1000}
            info["batching"] |= {"max_queue": config.max_queue, "max_cells": config.max_cells}
        info["instances"] = [instance.public_info() for instance in self.instances]
        if task is not None and self.ready:
            info.update(task.describe(self))
        if self.error:
            info["error"] = self.error
        return info
