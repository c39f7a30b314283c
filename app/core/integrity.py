"""Artifact files: their sha256 (the exporter writes it to the manifest, the service checks it) and .npy arrays."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import numpy as np

_reading_npy = threading.Lock()


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file."""
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def load_npy(path: Path) -> np.ndarray:
    """The array of an .npy file, memory-mapped read-only; one file at a time in the process: numpy parses the
    header with `ast.literal_eval`, which CPython 3.11 cannot run in two threads at once (SystemError)."""
    with _reading_npy:
        return np.lib.format.open_memmap(path, mode="r")  # an .npy file only: never a pickle, nor an .npz
