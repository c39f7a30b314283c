"""A served model (`ServedModel`) and what the runtime needs from its task family (the `Task` protocol)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import onnxruntime as ort
from fastapi import APIRouter
from pydantic import BaseModel

from app.core.errors import ModelNotReady
from app.core.manifest import ModelEntry
from app.runtime.collate import Feeds
from app.runtime.tensors import TensorSpec

if TYPE_CHECKING:
    from app.runtime.batcher import ModelBatcher
    from app.runtime.instances import Instance


@dataclass(frozen=True)
class GraphLayout:
    """One graph's sequence inputs (padded along axis 1) and outputs (trimmed to each item's length + extra)."""

    sequence_inputs: tuple[str, ...] = ()
    sequence_outputs: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))


def graph_layouts(task: Task) -> Mapping[str, GraphLayout]:
    """The extra graphs of the same weights a model of `task` may carry (the manifest's `graphs`), by key."""
    return getattr(task, "graphs", MappingProxyType({}))


@dataclass(frozen=True)
class Admission:
    """The room a request takes before it runs: in which batcher, how many rows and cells (None: estimated)."""

    batcher: ModelBatcher
    rows: int
    cells: int | None = None


@dataclass(frozen=True)
class Endpoint:
    """One POST endpoint of a task's JSON API: the body validated as `request`, admitted as `admit` says, answered by
    `answer(model, body, alone)` within the deadline (`alone`: no other request, so it may run inline)."""

    path: str
    name: str
    operation_id: str
    request: type[BaseModel]
    response: type[BaseModel]
    description: str
    admit: Callable[[ServedModel, Any], Admission]
    answer: Callable[[ServedModel, Any, bool], Awaitable[bytes]]
    reserve: bool = True  # a large body holds room in its model's batcher while parsed (False: another graph's)


class TensorCodec(Protocol):
    """What a task provides to serve its models over a tensor protocol."""

    PLATFORM: str

    def inputs(self, model: ServedModel) -> list[TensorSpec]: ...
    def outputs(self, model: ServedModel) -> list[TensorSpec]: ...

    def prepare(self, model: ServedModel, tensors: dict[str, np.ndarray | None]) -> Any:
        """The checked request (blocking, on a worker thread), with the `rows` and `cells` the batcher admits."""

    async def infer(self, model: ServedModel, prepared: Any) -> Feeds: ...


class Task(Protocol):
    """A task family: its service's hooks, and the codecs each transport needs."""

    name: str
    tag: str  # the OpenAPI tag of its endpoints
    endpoints: Sequence[Endpoint]  # the JSON POST endpoints (app/transports/rest.py)
    routes: APIRouter  # its other REST routes, which need none of the transport's machinery
    tensors: TensorCodec | None  # its Open Inference Protocol codec, if it has one
    sequence_inputs: tuple[str, ...]
    sequence_outputs: Mapping[str, int]

    def prepare(self, model: ServedModel) -> Any:
        """Check the model's metadata, limits and assets once loaded; return the typed state (`model.state`)."""

    def describe(self, model: ServedModel) -> dict[str, Any]:
        """The task's own fields in GET /models."""


@dataclass
class ServedModel:
    """One manifest entry and, once loaded, its sessions, assets, task state, batcher and extra graphs."""

    entry: ModelEntry
    assets: dict[str, np.ndarray] = field(default_factory=dict)
    state: Any = None
    error: str | None = None
    instances: list[Instance] = field(default_factory=list)  # one session per MNEMO_PROVIDER entry
    output_names: list[str] = field(default_factory=list)
    graphs: dict[str, ServedModel] = field(default_factory=dict)
    batcher: ModelBatcher | None = None  # set by the runtime (app/runtime/engine.py)

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def task(self) -> str:
        return self.entry.task

    @property
    def session(self) -> ort.InferenceSession | None:  # the first instance's: all have the same inputs and outputs
        return self.instances[0].session if self.instances else None

    @property
    def provider(self) -> str | None:
        return self.instances[0].provider if self.instances else None

    @property
    def ready(self) -> bool:
        return bool(self.instances) and self.error is None

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A blocking run on the first instance, outside the batcher (requests go through `batcher`)."""
        if not self.instances:
            raise ModelNotReady(f"Model {self.name} is not loaded: {self.error}")
        return self.instances[0].run(feeds)

    def public_info(self, task: Task | None) -> dict[str, Any]:
        """What GET /models reports (file names only, never server paths)."""
        info = self.entry.model_dump(include={"name", "task", "version", "sha256"})
        info |= {"provider": self.provider, "default": self.entry.default, "ready": self.ready}
        info |= self.entry.model_dump(include={"limits", "metrics", "metadata", "card"})
        if self.batcher is not None:
            config = self.batcher.config
            info["batching"] = {"max_batch": config.max_batch, "max_wait_ms": config.max_wait_s * 1000}
            info["batching"] |= {"max_queue": config.max_queue, "max_cells": config.max_cells}
        info["instances"] = [instance.public_info() for instance in self.instances]
        if task is not None and self.ready:
            info.update(task.describe(self))
        if self.error:
            info["error"] = self.error
        return info
