"""Reading .npy files while the models load in parallel threads."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

_reading = threading.Lock()


def load_npy(path: Path) -> np.ndarray:
    """The array of an .npy file, memory-mapped read-only; one file at a time in the process.

    numpy parses each file's header with `ast.literal_eval`, and CPython 3.11 keeps the AST constructor's
    recursion depth per interpreter, not per thread: two threads parsing at once can fail one of them with
    SystemError "AST constructor recursion depth mismatch". It made a model fail to load once in a test run.
    """
    with _reading:
        return np.load(path, mmap_mode="r", allow_pickle=False)
