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
    parser.add_argument("--version", default="1.0.0")
    parser.add_argument("--notes", default="", help="free text for the card's Notes section")
    return parser


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
