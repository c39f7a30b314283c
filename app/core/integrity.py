"""File hashing shared by the exporter (writes the manifest) and the registry (verifies it)."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify(path: Path, name: str, sha256: str, what: str) -> None:
    """ValueError naming `what` and `name` unless the file exists and has the manifest's `sha256`."""
    if not path.is_file():
        raise ValueError(f"{what} {name} is missing")
    actual = sha256_of(path)
    if actual != sha256:
        raise ValueError(f"{what} {name} has sha256 {actual}, but the manifest says {sha256}; refusing to serve it")
