"""MSRP (Dolan and Brockett 2005): sentence pairs labelled 1 (paraphrase) or 0, and a stratified validation split."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SPLIT_FILES = {"train": "msr_paraphrase_train.txt", "test": "msr_paraphrase_test.txt"}
COLUMNS = ("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String")


class MsrpDataError(ValueError):
    """A malformed MSRP file; the message names the file and the line."""


@dataclass(frozen=True)
class MsrpPair:
    sentence_a: str
    sentence_b: str
    paraphrase: int  # 1: the annotators judged the two sentences paraphrases


def read_split(path: Path) -> list[MsrpPair]:
    """Read one tab-separated MSRP file (UTF-8 with a byte-order mark, CRLF) with its header, validating every row.

    Quotes are text, not field delimiters: some sentences hold an unmatched `"`."""
    pairs = []
    with path.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(reader, None)
        if header is None or tuple(header) != COLUMNS:
            raise MsrpDataError(f"{path}:1: expected the header {' | '.join(COLUMNS)}")
        for line_no, row in enumerate(reader, start=2):
            if len(row) != len(COLUMNS) or row[0] not in ("0", "1"):
                raise MsrpDataError(f"{path}:{line_no}: expected 5 tab-separated fields, the first 0 or 1")
            pairs.append(MsrpPair(row[3], row[4], int(row[0])))
    return pairs


def stratified_split(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, validation): `fraction` of each label's rows, drawn with `seed`, go to validation."""
    rng = np.random.default_rng(seed)
    validation = []
    for label in np.unique(labels):
        rows = np.flatnonzero(labels == label)
        validation.extend(rng.choice(rows, size=round(fraction * len(rows)), replace=False).tolist())
    held = np.zeros(len(labels), dtype=bool)
    held[validation] = True
    return np.flatnonzero(~held), np.flatnonzero(held)
