"""What the frame needs from a task family (similarity, knowledge tracing, ...): the `Task` protocol.

A task is registered once (app/tasks/__init__.py). The registry calls `prepare` for every model of
that task after its session is verified and warmed, and keeps the typed state it returns in
`model.state`; `describe` adds the task's fields to GET /models. The batcher pads `sequence_inputs`
along axis 1 and trims `sequence_outputs` back to each item's length (+ the given extra).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from fastapi import APIRouter

if TYPE_CHECKING:
    from app.frame.registry import ServedModel


class Task(Protocol):
    name: str
    router: APIRouter
    sequence_inputs: tuple[str, ...]
    sequence_outputs: Mapping[str, int]

    def prepare(self, model: ServedModel) -> Any:
        """Check the model's metadata, limits and assets; return the typed state requests need."""

    def describe(self, model: ServedModel) -> dict[str, Any]:
        """The task's own fields in GET /models."""
