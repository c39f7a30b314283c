"""File hashing shared by the exporter (writes the manifest) and the registry (verifies it)."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file."""
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def verify(path: Path, name: str, sha256: str, what: str) -> None:
    """ValueError naming `what` and `name` unless the file exists and has the manifest's `sha256`."""
    if not path.is_file():
        raise ValueError(f"{what} {name} is missing")
    actual = sha256_of(path)
    if actual != sha256:
        raise ValueError(f"{what} {name} has sha256 {actual}, but the manifest says {sha256}; refusing to serve it")
