"""Argument types of the training and export commands: a bad value is one argparse error naming the option,
never a traceback from deep inside a run (or a run that silently does something else)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from pathlib import Path

KT_DATASET = re.compile(r"assist2009|assist2015|statics|synthetic-v(1?[0-9])")
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # what the service's manifest and requests accept


def positive_int(text: str) -> int:
    value = _number(int, text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def non_negative_int(text: str) -> int:
    value = _number(int, text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def positive_float(text: str) -> float:
    value = _number(float, text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, not {value}")
    return value


def probability(text: str) -> float:
    """A dropout rate: 0 <= p < 1."""
    value = _number(float, text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 0 and below 1, not {value}")
    return value


def kt_dataset(text: str) -> str:
    if KT_DATASET.fullmatch(text) is None:
        raise argparse.ArgumentTypeError(
            f"unknown data set {text!r}: assist2009, assist2015, statics or synthetic-v0..19"
        )
    return text


def model_name(text: str) -> str:
    """A served model's name: also the stem of its files in the artifacts directory, so no '/' or '..'."""
    if MODEL_NAME.fullmatch(text) is None:
        raise argparse.ArgumentTypeError(
            f"{text[:70]!r} is not a model name: 1 to 64 of A-Z a-z 0-9 . _ -, starting with a letter or digit"
        )
    return text


def training_run(text: str) -> Path:
    """A directory written by models.train_kt or models.train_sim (it holds result.json)."""
    path = Path(text)
    if not (path / "result.json").is_file():
        raise argparse.ArgumentTypeError(f"{path} is not a training run directory (no result.json in it)")
    return path


def run_directory(text: str) -> Path:
    """Where a training run writes (created if missing): refused when it is a file."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{path} is a file, not a run directory")
    return path


def parse_training_arguments(
    parser: argparse.ArgumentParser, argv: list[str] | None, default_out: Callable[[argparse.Namespace], Path]
) -> argparse.Namespace:
    """The arguments, with `out` set (`default_out(args)` when not given); a directory holding an earlier run is
    an error unless `--resume` continues it or `--overwrite` starts it again (it was overwritten without a word)."""
    args = parser.parse_args(argv)
    args.out = args.out or default_out(args)
    if (args.out / "last.pt").exists() and not (args.resume or args.overwrite):
        parser.error(
            f"{args.out} holds an earlier run (last.pt): --resume continues it, --overwrite starts it again, "
            "or choose another --out"
        )
    return args


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """--resume and --overwrite, for a run directory that already holds a run."""
    runs = parser.add_mutually_exclusive_group()
    runs.add_argument("--resume", action="store_true", help="continue the run in --out from its last.pt")
    runs.add_argument("--overwrite", action="store_true", help="start again in an --out that holds an earlier run")


def _number(kind: type, text: str):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
