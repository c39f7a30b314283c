"""Small helpers shared by the training commands: seeding, threads, checkpoints, run records."""

from __future__ import annotations

import json
import os
import random
import shlex
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from app.core.integrity import sha256_of

DEFAULT_DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"


def data_dir_default() -> Path:
    """`$MNEMO_DATA_DIR`, else ../shared/data next to the project."""
    return Path(os.environ.get("MNEMO_DATA_DIR", DEFAULT_DATA_DIR))


def seed_everything(seed: int) -> torch.Generator:
    """Seed python, numpy and torch; return a torch generator for data shuffling."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def set_threads(threads: int) -> None:
    """Limit torch to `threads` CPU threads (1 when two jobs share two cores)."""
    torch.set_num_threads(threads)


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """Write a checkpoint atomically (a crash never leaves a half-written file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(payload, tmp)
    tmp.replace(path)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read a checkpoint written by `save_checkpoint`."""
    return torch.load(path, map_location="cpu", weights_only=False)


def data_file_records(files: dict[str, Path]) -> dict[str, dict[str, str]]:
    """Each data file a run read, with its sha256, for the result and the model card."""
    return {name: {"file": str(path), "sha256": sha256_of(path)} for name, path in files.items()}


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Pretty JSON with a trailing newline, written whole or not at all (a full disk keeps the previous file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp")
    try:
        tmp.write_text(json.dumps(payload, indent=2) + "\n")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def command_line(module: str, argv: list[str] | None = None) -> str:
    """The command that started this run (`python -m <module> <args>`), for the model card; `argv` when
    `main(argv)` was called from Python, else the process's own arguments."""
    return shlex.join(["python", "-m", module, *(sys.argv[1:] if argv is None else argv)])
