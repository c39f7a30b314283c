"""What the frame needs from a task family (similarity, knowledge tracing, ...): the `Task` protocol.

A task is registered once (app/tasks/__init__.py). The registry calls `prepare` for every model of
that task after its session is verified and warmed, and keeps the typed state it returns in
`model.state`; `describe` adds the task's fields to GET /models. The batcher pads `sequence_inputs`
along axis 1 and trims `sequence_outputs` back to each item's length (+ the given extra).

A model may carry more graphs of the same weights (the manifest's `graphs`, e.g. a sentence encoder alone):
its task lists them in `graphs` with their batching layout, and each gets its own session and batcher
(`model.graphs[key]`). A task without such graphs need not declare `graphs`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from fastapi import APIRouter

if TYPE_CHECKING:
    from app.frame.registry import ServedModel


@dataclass(frozen=True)
class GraphLayout:
    """How the batcher pads the inputs and trims the outputs of one graph (see the module docstring)."""

    sequence_inputs: tuple[str, ...] = ()
    sequence_outputs: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))


def graph_layouts(task: Task) -> Mapping[str, GraphLayout]:
    """The extra graphs a model of `task` may carry, by manifest key (none unless the task declares `graphs`)."""
    return getattr(task, "graphs", MappingProxyType({}))


class Task(Protocol):
    name: str
    router: APIRouter
    sequence_inputs: tuple[str, ...]
    sequence_outputs: Mapping[str, int]

    def prepare(self, model: ServedModel) -> Any:
        """Check the model's metadata, limits and assets; return the typed state requests need."""

    def describe(self, model: ServedModel) -> dict[str, Any]:
        """The task's own fields in GET /models."""
