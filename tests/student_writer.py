"""Appends to one student through `update_state`, as a test writer thread or a child process.

Child process: `python -m tests.student_writer URL STUDENT_ID WRITER COUNT` appends COUNT times and prints
each acknowledged interaction count on its own line, flushed, right after the store acknowledged it.
Each append adds 1 to the interaction count and to every value of memory row WRITER, so a lost update
shows in both.
"""

from __future__ import annotations

import sys

import numpy as np

from app.students.factory import open_store
from app.students.store import StateStore, StudentState
from app.students.update import NextState, update_state

MODEL = "dkvmn-test"
MODEL_SHA256 = "ab" * 32
SHAPE = (20, 200)


def append_one(store: StateStore, student_id: str, writer: int) -> StudentState:
    """One read-modify-CAS-retry append; returns the state as stored."""

    def compute(current: StudentState | None) -> NextState[None]:
        memory = np.zeros(SHAPE, dtype=np.float32) if current is None else current.memory.copy()
        memory[writer] += 1
        return NextState(memory, 1 if current is None else current.interactions + 1, None)

    stored, _ = update_state(store, MODEL, student_id, MODEL_SHA256, compute)
    return stored


def main(argv: list[str]) -> None:
    url, student_id, writer, count = argv[0], argv[1], int(argv[2]), int(argv[3])
    store = open_store(url)
    for _ in range(count):
        print(append_one(store, student_id, writer).interactions, flush=True)
    store.close()


if __name__ == "__main__":
    main(sys.argv[1:])
