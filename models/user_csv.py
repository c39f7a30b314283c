"""A user's own CSV for `mnemo train`: read it with one-line errors, and split its keys into train, valid and test.

Both own-data trainers (answer logs, models/answer_log.py; scored sentence pairs, models/scored_pairs.py) read
their file here: fields are separated by commas, or by semicolons or tabs when the header line has no comma
(spreadsheets in many locales write those), with strict quoting (a stray quote is an error on its line, not part
of a value); column names are matched without case or surrounding spaces; the header is checked (empty file,
repeated or missing column), every row must have as many fields as the header and a value in each required
column, and values are stripped. Each problem raises `OwnDataError`, one line naming the file and, where it
applies, the line and the column.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import TypeVar

import numpy as np

# The split, fixed before any training: a seeded permutation, then these shares (each at least one key).
VALID_SHARE, TEST_SHARE = 0.15, 0.15
MIN_KEYS = 3
DELIMITERS = (",", ";", "\t")  # the first of them in the header line separates the fields

Record = tuple[int, dict[str, str]]  # the CSV line a row ends on, its stripped values by column
Key = TypeVar("Key", str, int)


class OwnDataError(ValueError):
    """A CSV (or run directory) the trainer cannot use; the message is one line naming the file, line and column."""


def read_records(path: Path, required: tuple[str, ...]) -> tuple[list[str], list[Record]]:
    """The header's column names and every row of the CSV at `path`, each with the required columns filled."""
    if path.is_dir():
        raise OwnDataError(f"{path}: a directory, not a CSV file")
    if not path.exists():
        raise OwnDataError(f"{path}: no such file")
    if not path.is_file():
        raise OwnDataError(f"{path}: not a regular file (a CSV is read twice: once to check it, once to hash it)")
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:
            delimiter = next((mark for mark in DELIMITERS if mark in handle.readline()), ",")
            handle.seek(0)
            reader = csv.DictReader(handle, delimiter=delimiter, strict=True)
            reader.fieldnames = names = _check_header(path, reader.fieldnames, required)
            records = [(reader.line_num, _record(path, reader.line_num, record, required)) for record in reader]
    except UnicodeDecodeError as error:
        raise OwnDataError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    except csv.Error as error:  # raised by the csv reader, so it exists and counts the line it failed on
        raise OwnDataError(f"{path}:{reader.reader.line_num}: not a readable CSV ({error})") from None
    except OSError as error:
        raise OwnDataError(f"{path}: cannot read it ({error.strerror})") from None
    if not records:
        raise OwnDataError(f"{path}: the header has no rows under it")
    return names, records


def _check_header(path: Path, fieldnames: list[str] | None, required: tuple[str, ...]) -> list[str]:
    if not fieldnames:
        raise OwnDataError(f"{path}: the file is empty (expected a header: {', '.join(required)})")
    names = [name.strip().lower() for name in fieldnames]
    repeated = sorted({name for name in names if name and names.count(name) > 1})
    if repeated:
        raise OwnDataError(f"{path}:1: column {repeated[0]!r} appears more than once in the header")
    missing = [name for name in required if name not in names]
    if missing:
        raise OwnDataError(f"{path}:1: missing column {missing[0]!r} (the header has: {', '.join(names)})")
    return names


def _record(path: Path, line: int, record: dict, required: tuple[str, ...]) -> dict[str, str]:
    if None in record:
        raise OwnDataError(f"{path}:{line}: more fields than the header has columns")
    if None in record.values():
        given = sum(value is not None for value in record.values())
        raise OwnDataError(f"{path}:{line}: {given} field(s), the header has {len(record)} columns")
    record = {key: value.strip() for key, value in record.items()}
    for column in required:
        if not record[column]:
            raise OwnDataError(f"{path}:{line}: column {column!r} is empty")
    return record


def split_keys(keys: list[Key], seed: int, unit: str) -> dict[str, list[Key]]:
    """The keys (students, pairs: `unit`) of the train, valid and test splits: a permutation seeded by `seed` of
    the sorted keys, the first `TEST_SHARE` of them test, the next `VALID_SHARE` valid (each at least one), the
    rest train."""
    names = sorted(keys)
    if len(names) < MIN_KEYS:
        raise OwnDataError(
            f"{len(names)} {unit}(s): the split by {unit} into train, valid and test needs at least {MIN_KEYS}"
        )
    order = [names[i] for i in np.random.default_rng(seed).permutation(len(names))]
    n_test = max(1, round(TEST_SHARE * len(names)))
    n_valid = max(1, round(VALID_SHARE * len(names)))
    return {"test": order[:n_test], "valid": order[n_test : n_test + n_valid], "train": order[n_test + n_valid :]}
