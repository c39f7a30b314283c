"""Reading .npy files while the models load in parallel threads."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

_reading = threading.Lock()


def load_npy(path: Path) -> np.ndarray:
    """The array of an .npy file, memory-mapped read-only; one file at a time in the process: numpy parses the
    header with `ast.literal_eval`, which CPython 3.11 cannot run in two threads at once (SystemError)."""
    with _reading:
        return np.load(path, mmap_mode="r", allow_pickle=False)
