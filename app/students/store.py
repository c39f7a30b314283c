"""The student-state store interface, its errors, and `update_state`: the compare-and-swap loop of every append.
`revision` is a store-wide write sequence, never reused, so a recreated student is never taken for an erased one."""

from __future__ import annotations

import asyncio
import random
import re
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from operator import methodcaller
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import numpy as np
from pydantic import BaseModel, Field, NonNegativeInt, PositiveInt, TypeAdapter, ValidationError, model_validator

from app.core.errors import ServiceError

if TYPE_CHECKING:
    from app.students.io import StoreHolder  # or a test's inline stand-in with its read and commit

MEMORY_DTYPE = np.dtype("<f4")  # float32, little-endian on disk whatever the machine
MAX_ATTEMPTS = 100
MAX_BACKOFF_S = 0.05
COUNT = TypeAdapter(NonNegativeInt)
Result = TypeVar("Result")
# Unix seconds, UTC, from 1970 to a date Python's datetime holds (9999-12-31): not nan, inf or 1e300
Timestamp = Annotated[float, Field(ge=0, le=253402300799, allow_inf_nan=False)]
Fields = tuple[str, str, bytes, int, int, int, str]  # what a write stores: StudentState's fields up to model_sha256


class StudentState(BaseModel, frozen=True):
    """One student's recurrent state under one model, checked as read: a row or hash written by something else may
    lack a field or hold another type. `memory` is read-only float32 (DKVMN [N, d_v], DKT [2, S])."""

    model: str
    student_id: str
    memory_bytes: bytes
    rows: PositiveInt
    columns: PositiveInt
    interactions: NonNegativeInt
    model_sha256: str
    created_at: Timestamp
    updated_at: Timestamp
    revision: int

    @model_validator(mode="after")
    def _sized(self) -> StudentState:
        if len(self.memory_bytes) != self.rows * self.columns * MEMORY_DTYPE.itemsize:
            shape = f"{self.rows} x {self.columns} float32"
            raise ValueError(f"memory holds {len(self.memory_bytes)} bytes, not {shape}")
        return self

    @property
    def memory(self) -> np.ndarray:
        return np.frombuffer(self.memory_bytes, dtype=MEMORY_DTYPE).reshape(self.rows, self.columns)


class StoreError(ServiceError):
    """A store error, answered with its status and sentence; by default 409, a conflict with the stored state."""

    status_code = 409


class StoreUnavailable(StoreError):
    """The database cannot be reached or failed: 503. `detail` names no path, host or port, `internal` goes to the
    log only; `until_restart`: no retry helps before a restart (no Retry-After)."""

    status_code = 503

    def __init__(self, detail: str, internal: str, *, until_restart: bool = False) -> None:
        super().__init__(detail)
        self.internal, self.until_restart = internal, until_restart


class StateVersionMismatch(StoreError):
    """The stored state was built by another version (sha256) of the model: 409, never silently mixed."""

    def __init__(self, model: str, stored_sha256: str, served_sha256: str) -> None:
        super().__init__(
            f"The stored state of this student for model {model} was built by another version of the model "
            f"(sha256 {stored_sha256[:12]}..., served {served_sha256[:12]}...). Delete the student "
            f"(DELETE /students/{{student_id}}) and send the history again to rebuild it with the served version."
        )


class InteractionCountMismatch(StoreError):
    """The stored count is not the append's `expected_interactions`: 409, nothing stored (never applied twice)."""

    def __init__(self, model: str, stored: int, expected: int) -> None:
        super().__init__(
            f"This student's state under model {model} has {stored} interactions, not the {expected} of "
            "expected_interactions: nothing was stored. If this was the retry of an append whose answer was lost, "
            "that append was stored already; else read the student (GET /students/{student_id}) and decide."
        )


class UnreadableState(StoreError):
    """A stored state this service cannot read (not written by it): 409, saying what is wrong and how to reset."""

    def __init__(self, model: str, student_id: str, problem: str) -> None:
        super().__init__(
            f"The stored state of student {student_id!r} under model {model} cannot be read ({problem}); it was not "
            f"written by this service. DELETE /students/{student_id} erases it; then send the history again."
        )


class RevisionConflict(StoreError):
    """A compare-and-swap lost: the state changed since it was read (409). `update_state` retries on it."""


class StateStore(ABC):
    """Per-student state (SQLite embedded, Redis for several replicas); synchronous and thread-safe, and a
    database that cannot be reached raises `StoreUnavailable` within a bounded time."""

    name: str  # the database, in the messages of `StoreUnavailable`
    where: str  # its path or address, in the log only
    driver_errors: type[Exception] | tuple[type[Exception], ...]
    tells_driver_messages = True  # False where they may name a path, host or port: the client gets the error's kind
    refusals: type[Exception] | tuple[type[Exception], ...] = ()  # errors after which nothing was written

    @abstractmethod
    def read(self, model: str, student_id: str) -> StudentState | None: ...

    def write(
        self,
        model: str,
        student_id: str,
        memory: np.ndarray,
        interactions: int,
        model_sha256: str,
        expected_revision: int | None,
    ) -> StudentState:
        """Store the state durably if the revision is `expected_revision` (None: absent) and the sha256 is the same."""
        if memory.dtype != np.float32 or memory.ndim != 2:
            raise ValueError(f"memory must be a 2-D float32 array, got {memory.ndim}-D {memory.dtype}")
        blob = memory.astype(MEMORY_DTYPE, copy=False).tobytes(order="C")
        fields: Fields = (model, student_id, blob, *memory.shape, interactions, model_sha256)
        stored_sha256, current, *written = self._swap(fields, expected_revision)
        if stored_sha256 not in (None, model_sha256):
            raise StateVersionMismatch(model, stored_sha256, model_sha256)
        if not written:
            raise RevisionConflict(f"state revision is {current}, expected {expected_revision}")
        return state_of(*fields, *written)

    @abstractmethod
    def _swap(self, fields: Fields, expected_revision: int | None) -> tuple[Any, ...]:
        """`write` in the database, refused unless the revision and the sha256 match: the stored sha256 and revision,
        then, if written, the stored (created_at, updated_at, revision)."""

    @abstractmethod
    def delete(self, student_id: str) -> dict[str, int | None]:
        """Remove everything about `student_id`, under every model, atomically; return each removed state's
        interaction count by model (None: unreadable), in model order."""

    @abstractmethod
    def ids_after(self, after: str | None, count: int) -> list[str]:
        """Up to `count` ids with a state in ascending code-point order, each greater than `after` (None: the first)."""

    @abstractmethod
    def check_health(self) -> None: ...

    @abstractmethod
    def close(self) -> None: ...

    @contextmanager
    def _unavailable(self, consequence: str = "") -> Iterator[None]:
        """The driver's errors as `StoreUnavailable`, `consequence` told too; the log also gets `where`."""
        try:
            yield
        except self.driver_errors as error:
            kind = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", type(error).__name__).lower()  # TimeoutError: timeout error
            told = error if self.tells_driver_messages else kind
            raise StoreUnavailable(
                f"{self.name} state store failed: {told}{'' if isinstance(error, self.refusals) else consequence}",
                f"{self.name} state store {self.where} failed: {type(error).__name__}: {error}",
            ) from error


def state_of(model: str, student_id: str, *stored: Any) -> StudentState:
    """A StudentState from its stored fields in its order (None: missing), or `UnreadableState` saying what is wrong."""
    given = zip(StudentState.model_fields, (model, student_id, *stored), strict=True)
    try:
        return StudentState(**{name: value for name, value in given if value is not None})
    except ValidationError as error:
        problem = "; ".join(": ".join([*map(str, detail["loc"]), detail["msg"]]) for detail in error.errors())
        raise UnreadableState(model, student_id, problem) from None


def stored_count(value: Any) -> int | None:
    """The interaction count of a state being erased; None when it cannot be read."""
    with suppress(ValidationError):
        return COUNT.validate_python(value)
    return None


async def update_state(
    calls: StoreHolder,
    model: str,
    student_id: str,
    model_sha256: str,
    compute: Callable[[StudentState | None], Awaitable[tuple[np.ndarray, int, Result]]],
    *,
    expected_interactions: int | None = None,
    max_attempts: int = MAX_ATTEMPTS,
) -> tuple[StudentState, Result]:
    """Store `compute(state)` (the new memory, count and a result) by compare-and-swap; `compute` is side-effect free:
    after a lost race it reruns on the latest state, after a random growing delay."""
    for attempt in range(max_attempts):
        current = await calls.read(methodcaller("read", model, student_id))
        if current is not None and current.model_sha256 != model_sha256:
            raise StateVersionMismatch(model, current.model_sha256, model_sha256)
        stored = 0 if current is None else current.interactions
        if expected_interactions is not None and stored != expected_interactions:
            raise InteractionCountMismatch(model, stored, expected_interactions)
        memory, interactions, result = await compute(current)
        expected_revision = None if current is None else current.revision
        write = methodcaller("write", model, student_id, memory, interactions, model_sha256, expected_revision)
        try:
            return await calls.commit(write), result
        except RevisionConflict:
            await asyncio.sleep(random.uniform(0, min(MAX_BACKOFF_S, 0.001 * 2**attempt)))
    raise RevisionConflict(
        f"the state of this student changed {max_attempts} times while this update was computed; retry the request"
    )
