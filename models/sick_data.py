"""SICK (Marelli et al. 2014): sentence pairs with relatedness (1..5) and a 3-way entailment label."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ENTAILMENT_LABELS = ("ENTAILMENT", "NEUTRAL", "CONTRADICTION")
SPLIT_FILES = {"train": "SICK_train.txt", "trial": "SICK_trial.txt", "test": "SICK_test_annotated.txt"}
COLUMNS = ("pair_ID", "sentence_A", "sentence_B", "relatedness_score", "entailment_judgment")


class SickDataError(ValueError):
    """A malformed SICK file; the message names the file and the line."""


@dataclass(frozen=True)
class SickPair:
    sentence_a: str
    sentence_b: str
    relatedness: float
    entailment: int  # index into ENTAILMENT_LABELS


def read_split(path: Path) -> list[SickPair]:
    """Read one tab-separated SICK file with its header, validating every row."""
    pairs = []
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(reader, None)
        if header is None or tuple(header[: len(COLUMNS)]) != COLUMNS:
            raise SickDataError(f"{path}:1: expected the header {' '.join(COLUMNS)}")
        for line_no, row in enumerate(reader, start=2):
            try:
                score = float(row[3])
                label = ENTAILMENT_LABELS.index(row[4])
            except (IndexError, ValueError):
                raise SickDataError(f"{path}:{line_no}: expected 5 tab-separated fields as in the header") from None
            if not 1.0 <= score <= 5.0:
                raise SickDataError(f"{path}:{line_no}: relatedness {score} is outside 1..5")
            pairs.append(SickPair(row[1], row[2], score, label))
    return pairs


def relatedness_target(score: float) -> np.ndarray:
    """Tai et al. (2015) sparse target distribution over the classes 1..5 whose mean is `score`."""
    target = np.zeros(5, dtype=np.float32)
    low = int(np.floor(score))
    if low == score:
        target[low - 1] = 1.0
    else:
        target[low - 1] = low + 1 - score
        target[low] = score - low
    return target
