"""What both own-data trainers (`mnemo train kt`, `mnemo train similarity`) share about a run directory.

A run writes `<run>/protocol.json` (the data, the split, the recipe and the selection rule) before training,
`<run>/last.pt` after each epoch and `<run>/result.json` once the test split has been evaluated.
"""

from __future__ import annotations

import json
from pathlib import Path

from models.user_csv import OwnDataError


def check_run_dir(run_dir: Path, resume: bool, protocol: dict) -> dict | None:
    """Refuse a run directory that is a file, holds a checkpoint or a result without --resume, or is resumed
    with another protocol (other data, seed, model or epochs). Return the result of a finished run that
    --resume asks for: it is exported again (an export that failed is retried), never trained or tested again."""
    if run_dir.exists() and not run_dir.is_dir():
        raise OwnDataError(f"--run-dir {run_dir}: a file, not a directory")
    finished = run_dir / "result.json"
    if finished.exists() and not resume:
        raise OwnDataError(
            f"{run_dir} already holds a finished run evaluated on its test split: pass --resume to export it "
            "again, or choose another --run-dir"
        )
    if (run_dir / "last.pt").exists() and not resume:
        raise OwnDataError(f"{run_dir} holds an unfinished run: pass --resume, or choose another --run-dir")
    saved = run_dir / "protocol.json"
    if resume and saved.exists() and _json_of(saved) != protocol:
        raise OwnDataError(
            f"--resume: {saved} was written for other data or settings (data, seed, model or epochs differ)"
        )
    return _json_of(finished) if resume and finished.exists() else None


def _json_of(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise OwnDataError(f"{path}: unreadable ({error}); choose another --run-dir") from None


def run_record(run: object) -> dict:
    """A run's settings (a dataclass) as JSON values."""
    return {key: str(value) if isinstance(value, Path) else value for key, value in vars(run).items()}
