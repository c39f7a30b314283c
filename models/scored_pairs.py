"""A user's own scored sentence pairs (CSV) for the similarity model: read, validate, split by pair.

The CSV has a header with `sentence_a`, `sentence_b` and `score` (relatedness, a number in 1..5), and optionally
`label` (entailment: ENTAILMENT, NEUTRAL or CONTRADICTION, any case; then every row has one). A sentence must
have a word after the served tokenizer removes punctuation (app/tasks/similarity/tokenizer.py), and no more
characters than a request may send (app/tasks/similarity/schemas.py). Every problem
raises `OwnDataError`, one line naming the file and, where it applies, the line and the column.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from app.tasks.similarity.schemas import MAX_CHARACTERS
from app.tasks.similarity.tokenizer import CONTROL_CHARACTER, words
from models.sick_data import ENTAILMENT_LABELS, SickPair
from models.user_csv import OwnDataError, read_records, split_keys

REQUIRED = ("sentence_a", "sentence_b", "score")
LABEL = "label"
NO_LABEL = -100  # torch's cross-entropy ignore_index: a pair without a label teaches relatedness only
MIN_SCORE, MAX_SCORE = 1.0, 5.0


@dataclass(frozen=True)
class ScoredPairs:
    """The CSV's pairs in file order; `labelled` when it has a `label` column (every pair then has one)."""

    pairs: list[SickPair]
    labelled: bool


def read_scored_pairs(path: Path) -> ScoredPairs:
    """Parse and validate the CSV at `path`."""
    names, records = read_records(path, REQUIRED)
    labelled = LABEL in names
    required = (*REQUIRED, LABEL) if labelled else REQUIRED
    return ScoredPairs([_pair(path, line, record, required) for line, record in records], labelled)


def _pair(path: Path, line: int, record: dict[str, str], required: tuple[str, ...]) -> SickPair:
    for column in required:
        if not record[column]:
            raise OwnDataError(f"{path}:{line}: column {column!r} is empty")
    for column in ("sentence_a", "sentence_b"):
        if len(record[column]) > MAX_CHARACTERS:
            raise OwnDataError(
                f"{path}:{line}: column {column!r} has {len(record[column])} characters; a served sentence has at "
                f"most {MAX_CHARACTERS}"
            )
        if CONTROL_CHARACTER.search(record[column]):
            raise OwnDataError(f"{path}:{line}: column {column!r} holds a control character")
        if not words(record[column]):
            raise OwnDataError(f"{path}:{line}: column {column!r} has no words, only punctuation")
    try:
        score = float(record["score"])
    except ValueError:
        score = math.nan
    if not MIN_SCORE <= score <= MAX_SCORE:  # false for NaN too
        raise OwnDataError(f"{path}:{line}: column 'score' is {record['score']!r}, not a number in 1..5")
    label = NO_LABEL
    if LABEL in required:
        text = record[LABEL].upper()
        if text not in ENTAILMENT_LABELS:
            raise OwnDataError(
                f"{path}:{line}: column 'label' is {record[LABEL]!r}, not one of {', '.join(ENTAILMENT_LABELS)}"
            )
        label = ENTAILMENT_LABELS.index(text)
    return SickPair(record["sentence_a"], record["sentence_b"], score, label)


def split_pairs(data: ScoredPairs, seed: int) -> dict[str, list[int]]:
    """Row indices of the train, valid and test splits (models/user_csv.py: `split_keys`); Pearson r needs at
    least two different scores in the validation and test splits."""
    splits = split_keys(list(range(len(data.pairs))), seed, "pair")
    for name in ("valid", "test"):
        if len({data.pairs[row].relatedness for row in splits[name]}) < 2:
            raise OwnDataError(
                f"the {name} split ({len(splits[name])} pairs) has a single score, so its Pearson r is undefined: "
                "the CSV needs more pairs"
            )
    return splits
