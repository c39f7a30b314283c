"""The student-state store interface: what the HTTP layer needs, whatever the database.

A state is keyed by (model name, student id). `revision` is a store-wide write sequence number: every
successful write takes the next one, and a number is never reused, not even after a student is deleted
and created again. So a compare-and-swap on it can never confuse a recreated student with the state a
writer read before the erasure (no ABA), and no erased data is ever written back.

All methods are synchronous (the service calls them from worker threads) and safe to call from several
threads at once. A database that cannot be reached raises `StoreUnavailable` within a bounded time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

MAX_PAGE_SIZE = 1000
MEMORY_DTYPE = np.dtype("<f4")  # float32, little-endian on disk whatever the machine


@dataclass(frozen=True, eq=False)  # no field-wise ==: comparing numpy arrays has no single truth value
class StudentState:
    """One student's recurrent state under one model. `memory` is read-only float32: DKVMN's value memory
    [n_concepts, d_v], or DKT's LSTM state [2, S]."""

    model: str
    student_id: str
    memory: np.ndarray
    interactions: int
    model_sha256: str
    created_at: float  # Unix seconds, UTC
    updated_at: float
    revision: int


@dataclass(frozen=True)
class StudentPage:
    """Student ids in ascending code-point order; `next_after` is the cursor of the next page (None: last)."""

    student_ids: list[str]
    next_after: str | None


class StoreError(Exception):
    """A store error with an HTTP status and one sentence for the client (the shape of app errors)."""

    status_code = 500

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class StoreUnavailable(StoreError):
    """The database cannot be reached or answered with an error: 503, the stateless endpoints keep working.

    `detail` goes to the client and names no path, host or port; `internal` (default: the detail) only to
    the service's log. `until_restart`: retrying will not help until the service is restarted (no Retry-After)."""

    status_code = 503

    def __init__(self, detail: str, internal: str | None = None, *, until_restart: bool = False) -> None:
        super().__init__(detail)
        self.internal = internal or detail
        self.until_restart = until_restart


class StateVersionMismatch(StoreError):
    """The stored state was built by another version (sha256) of the model: 409, never silently mixed."""

    status_code = 409

    def __init__(self, model: str, stored_sha256: str, served_sha256: str) -> None:
        super().__init__(
            f"The stored state of this student for model {model} was built by another version of the model "
            f"(sha256 {stored_sha256[:12]}..., served {served_sha256[:12]}...). Delete the student "
            f"(DELETE /students/{{student_id}}) and send the history again to rebuild it with the served version."
        )
        self.model = model
        self.stored_sha256 = stored_sha256
        self.served_sha256 = served_sha256


class InteractionCountMismatch(StoreError):
    """The append named the count it extends (`expected_interactions`) and the stored count differs: 409,
    nothing stored. A retry of an append that was stored although its answer was lost ends here, not twice."""

    status_code = 409

    def __init__(self, model: str, stored: int, expected: int) -> None:
        super().__init__(
            f"This student's state under model {model} has {stored} interactions, not the {expected} of "
            "expected_interactions: nothing was stored. If this was the retry of an append whose answer was lost, "
            "that append was stored already; else read the student (GET /students/{student_id}) and decide."
        )


class RevisionConflict(StoreError):
    """A compare-and-swap lost: the state changed since it was read. `update_state` retries on it."""

    status_code = 409


class StateStore(Protocol):
    """Per-student DKVMN state behind one small interface (SQLite embedded, Redis for several replicas)."""

    def read(self, model: str, student_id: str) -> StudentState | None:
        """The state of `student_id` under `model`, or None if there is none."""
        ...

    def write(
        self,
        model: str,
        student_id: str,
        *,
        memory: np.ndarray,
        interactions: int,
        model_sha256: str,
        expected_revision: int | None,
    ) -> StudentState:
        """Compare-and-swap: store the state if the current revision is `expected_revision` (None: absent).

        Raises `RevisionConflict` if it is not, and `StateVersionMismatch` if the stored state belongs to
        another `model_sha256`. Returns the state as stored, with its new revision. Durable on return.
        """
        ...

    def delete(self, student_id: str) -> list[StudentState]:
        """Remove everything about `student_id`, under every model, atomically; return what was removed."""
        ...

    def list_students(self, *, after: str | None = None, limit: int = 100) -> StudentPage:
        """Up to `limit` (1..MAX_PAGE_SIZE) ids with a state, in ascending order, each greater than `after`."""
        ...

    def check_health(self) -> None:
        """Return if the database answers, else raise `StoreUnavailable`."""
        ...

    def close(self) -> None:
        """Release connections; the store is not used afterwards."""
        ...


def encode_memory(memory: np.ndarray) -> tuple[bytes, int, int]:
    """The float32 blob and shape of a value memory; anything but a 2-D float32 array is a caller bug."""
    if memory.dtype != np.float32 or memory.ndim != 2:
        raise ValueError(f"memory must be a 2-D float32 array, got {memory.ndim}-D {memory.dtype}")
    return memory.astype(MEMORY_DTYPE, copy=False).tobytes(order="C"), memory.shape[0], memory.shape[1]


def decode_memory(blob: bytes, rows: int, columns: int) -> np.ndarray:
    """The read-only float32 [rows, columns] array of a blob, bit for bit."""
    return np.frombuffer(blob, dtype=MEMORY_DTYPE).reshape(rows, columns)


def check_page_size(limit: int) -> None:
    """Reject a page size outside 1..MAX_PAGE_SIZE (the HTTP layer validates it first)."""
    if not 1 <= limit <= MAX_PAGE_SIZE:
        raise ValueError(f"limit must be 1 to {MAX_PAGE_SIZE}, got {limit}")
