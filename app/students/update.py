"""`update_state`: read, compute, compare-and-swap, retry: how every append reaches a store."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from app.students.store import (
    InteractionCountMismatch,
    RevisionConflict,
    StateStore,
    StateVersionMismatch,
    StudentState,
)

Result = TypeVar("Result")
MAX_ATTEMPTS = 100  # 8 processes x 50 appends on one student needed at most 22 (Redis, loaded machine)
MAX_BACKOFF_S = 0.05


@dataclass(frozen=True)
class NextState(Generic[Result]):
    """What an update computed from the current state: the new memory and count, and a result to return."""

    memory: np.ndarray
    interactions: int
    result: Result


class TooManyConflicts(RevisionConflict):
    """Every attempt lost the compare-and-swap to another writer of the same student: 409, retry later."""


class StoreRunner(Protocol):
    """How `update_state` calls the store: `StoreCalls` in the service, inline calls in a test writer."""

    async def read(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any: ...

    async def commit(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any: ...


async def update_state(
    calls: StoreRunner,
    store: StateStore,
    model: str,
    student_id: str,
    model_sha256: str,
    compute: Callable[[StudentState | None], Awaitable[NextState[Result]]],
    *,
    expected_interactions: int | None = None,
    max_attempts: int = MAX_ATTEMPTS,
) -> tuple[StudentState, Result]:
    """Apply `compute` to the student's current state (None: a new student) and store what it returns.

    `compute` may run more than once (once per lost compare-and-swap), always on the latest state, so it
    must not have side effects. A state built by another `model_sha256` raises `StateVersionMismatch`
    before `compute` runs, and so does a stored count other than `expected_interactions` (when given:
    `InteractionCountMismatch`, checked on the state the write replaces, so a retried append is never
    applied twice). After `max_attempts` lost races it raises `TooManyConflicts`; between attempts
    it sleeps a random, growing delay (at most MAX_BACKOFF_S) so that racing writers spread out.

    Cancelled (deadline, client gone) before a write starts, nothing is stored; once a write has started,
    its outcome is returned (`StoreRunner.commit`).
    """
    for attempt in range(max_attempts):
        current = await calls.read(store.read, model, student_id)
        if current is not None and current.model_sha256 != model_sha256:
            raise StateVersionMismatch(model, current.model_sha256, model_sha256)
        _check_count(model, current, expected_interactions)
        step = await compute(current)
        try:
            stored = await calls.commit(
                store.write,
                model,
                student_id,
                memory=step.memory,
                interactions=step.interactions,
                model_sha256=model_sha256,
                expected_revision=None if current is None else current.revision,
            )
        except RevisionConflict:
            await asyncio.sleep(random.uniform(0, min(MAX_BACKOFF_S, 0.001 * 2**attempt)))
            continue
        return stored, step.result
    raise TooManyConflicts(
        f"the state of this student changed {max_attempts} times while this update was computed; retry the request"
    )


def _check_count(model: str, current: StudentState | None, expected: int | None) -> None:
    """`InteractionCountMismatch` unless the state holds `expected` interactions (None: any count)."""
    stored = 0 if current is None else current.interactions
    if expected is not None and stored != expected:
        raise InteractionCountMismatch(model, stored, expected)
