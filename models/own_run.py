"""What both own-data trainers (`mnemo train kt`, `mnemo train similarity`) share about a run directory.

A run writes `<run>/protocol.json` (the data, the split, the recipe and the selection rule) before training,
`<run>/last.pt` after each epoch and `<run>/result.json` once the test split has been evaluated.
"""

from __future__ import annotations

import json
from pathlib import Path

from models.user_csv import OwnDataError


def check_run_dir(run_dir: Path, resume: bool, protocol: dict) -> None:
    """Refuse a run directory that holds a result (its test split was seen), a checkpoint without --resume, or a
    --resume of another protocol (other data, seed, model or epochs)."""
    if (run_dir / "result.json").exists():
        raise OwnDataError(
            f"{run_dir} already holds a finished run evaluated on its test split; choose another --run-dir"
        )
    saved = run_dir / "protocol.json"
    if (run_dir / "last.pt").exists() and not resume:
        raise OwnDataError(f"{run_dir} holds an unfinished run: pass --resume, or choose another --run-dir")
    if resume and saved.exists() and json.loads(saved.read_text()) != protocol:
        raise OwnDataError(
            f"--resume: {saved} was written for other data or settings (data, seed, model or epochs differ)"
        )


def run_record(run: object) -> dict:
    """A run's settings (a dataclass) as JSON values."""
    return {key: str(value) if isinstance(value, Path) else value for key, value in vars(run).items()}
