"""Pieces shared by every exporter: common command-line options and model-card sections."""

from __future__ import annotations

import argparse
from pathlib import Path

from models.cli import model_name, training_run


def exporter_parser(description: str, task: str) -> argparse.ArgumentParser:
    """The options every `python -m export.<task>` command takes."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=training_run, required=True, help="training run directory (best.pt, result.json)")
    parser.add_argument("--name", type=model_name, required=True, help="the served model's name (and its files' stem)")
    parser.add_argument("--artifacts", type=Path, default=Path("artifacts"))
    parser.add_argument("--default", action="store_true", help=f"the default {task} model")
    parser.add_argument(
        "--version", default="1.0.0", help="the model's version: higher than the served one (docs/MODELS.md §5.1)"
    )
    parser.add_argument("--notes", default="", help="free text for the card's Notes section")
    return parser


def duration(seconds: float) -> str:
    """A training time as a card states it: seconds under two minutes (a short run is not "0.0 min")."""
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def cpu_threads(*results: dict) -> str:
    """The torch threads the runs used (`--threads`; 1 for runs recorded before the field existed)."""
    counts = sorted({result.get("threads", 1) for result in results})
    text = "-".join(str(count) for count in (counts[0], counts[-1])[: 1 + (len(counts) > 1)])
    return f"{text} CPU thread{'' if counts == [1] else 's'}"


def data_files_table(result: dict) -> list[str]:
    """Markdown table of the data files a run read, with their sha256."""
    return [
        "| split | file | sha256 |",
        "|---|---|---|",
        *[
            f"| {split} | `{Path(info['file']).name}` | `{info['sha256']}` |"
            for split, info in result["data_files"].items()
        ],
    ]


def notes_section(notes: str) -> list[str]:
    """The card's free-text Notes section, if any."""
    return ["## Notes", "", notes, ""] if notes else []
