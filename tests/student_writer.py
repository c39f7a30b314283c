"""Appends to one student through `update_state`, as a test writer thread or a child process.

Child process: `python -m tests.student_writer URL STUDENT_ID WRITER COUNT` appends COUNT times and prints
each acknowledged interaction count on its own line, flushed, right after the store acknowledged it.
Each append adds 1 to the interaction count and to every value of memory row WRITER, so a lost update
shows in both.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from app.students.io import open_store
from app.students.store import StateStore, StudentState, update_state

MODEL = "dkvmn-test"
MODEL_SHA256 = "ab" * 32
SHAPE = (20, 200)


class InlineCalls:
    """Store calls made right where they are asked for (a writer thread or process has no event loop to spare)."""

    def __init__(self, store: StateStore) -> None:
        self.store = store

    async def read(self, call: Callable[[StateStore], Any]) -> Any:
        return call(self.store)

    commit = read


def update(store: StateStore, student_id: str, compute: Callable, **options: Any) -> tuple[StudentState, Any]:
    """`update_state` with inline store calls and a plain function as `compute`, run to completion."""

    async def computed(current: StudentState | None) -> tuple[np.ndarray, int, Any]:
        return await asyncio.to_thread(compute, current)  # a thread: `compute` may append itself (a race)

    return asyncio.run(update_state(InlineCalls(store), MODEL, student_id, MODEL_SHA256, computed, **options))


def append_one(store: StateStore, student_id: str, writer: int) -> StudentState:
    """One read-modify-CAS-retry append; returns the state as stored."""

    def compute(current: StudentState | None) -> tuple[np.ndarray, int, None]:
        memory = np.zeros(SHAPE, dtype=np.float32) if current is None else current.memory.copy()
        memory[writer] += 1
        return memory, 1 if current is None else current.interactions + 1, None

    stored, _ = update(store, student_id, compute)
    return stored


def main(argv: list[str]) -> None:
    url, student_id, writer, count = argv[0], argv[1], int(argv[2]), int(argv[3])
    store = open_store(url)
    for _ in range(count):
        print(append_one(store, student_id, writer).interactions, flush=True)
    store.close()


if __name__ == "__main__":
    main(sys.argv[1:])
