"""Knowledge-tracing data: the DKVMN authors' three-line CSV format, validated and cut into sequences.

Each student takes three lines: the number of attempts, the comma-separated 1-based question ids and
the comma-separated 0/1 responses (a trailing comma is allowed). Students longer than `seqlen` are cut
into consecutive chunks of `seqlen` (the last one shorter), each an independent sequence, as in the
published protocol (docs/MODELS.md §2.4).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

CV_FOLDS = 5  # cross-validation folds of a training split

DATASET_FILES = {
    "assist2009": ("assist2009_updated", "assist2009_updated"),
    "assist2015": ("assist2015", "assist2015"),
    "statics": ("STATICS", "STATICS"),
}


class KTDataError(ValueError):
    """A malformed knowledge-tracing file; the message names the file and the line."""


@dataclass(frozen=True)
class Student:
    """One student's history: question ids (1-based) and responses (0/1), oldest first."""

    questions: list[int]
    responses: list[int]


@dataclass(frozen=True)
class Sequences:
    """Padded sequences: q and r `[n, seqlen]` int64 (0 = padding), lengths `[n]` int64."""

    q: np.ndarray
    r: np.ndarray
    lengths: np.ndarray

    def __len__(self) -> int:
        return len(self.lengths)


def _parse_ints(text: str, path: Path, line_no: int, what: str) -> list[int]:
    fields = text.strip().split(",")
    if fields and fields[-1] == "":
        fields = fields[:-1]
    try:
        return [int(field) for field in fields]
    except ValueError as error:
        raise KTDataError(f"{path}:{line_no}: {what} must be comma-separated integers ({error})") from None


def read_students(path: Path, n_questions: int | None = None) -> list[Student]:
    """Parse and validate a three-line CSV; raise KTDataError naming the file and line on any problem."""
    lines = [line.rstrip("\n\r") for line in path.read_text().splitlines()]
    while lines and not lines[-1].strip():
        lines.pop()
    if len(lines) % 3:
        raise KTDataError(f"{path}:{len(lines)}: expected three lines per student, got {len(lines)} lines")
    students = []
    for start in range(0, len(lines), 3):
        count_line, q_line, r_line = start + 1, start + 2, start + 3
        try:
            count = int(lines[start].strip().rstrip(","))
        except ValueError:
            raise KTDataError(f"{path}:{count_line}: expected the number of attempts") from None
        questions = _parse_ints(lines[start + 1], path, q_line, "question ids")
        responses = _parse_ints(lines[start + 2], path, r_line, "responses")
        if len(questions) != count or len(responses) != count:
            raise KTDataError(
                f"{path}:{count_line}: {count} attempts announced but {len(questions)} questions "
                f"and {len(responses)} responses follow"
            )
        if any(q < 1 or (n_questions is not None and q > n_questions) for q in questions):
            limit = f"1..{n_questions}" if n_questions else ">= 1"
            raise KTDataError(f"{path}:{q_line}: question ids must be in {limit}")
        if any(r not in (0, 1) for r in responses):
            raise KTDataError(f"{path}:{r_line}: responses must be 0 or 1")
        if count:
            students.append(Student(questions, responses))
    return students


def to_sequences(students: list[Student], seqlen: int) -> Sequences:
    """Cut every student into chunks of at most `seqlen` and right-pad them with zeros."""
    chunks = []
    for student in students:
        for start in range(0, len(student.questions), seqlen):
            chunks.append((student.questions[start : start + seqlen], student.responses[start : start + seqlen]))
    q = np.zeros((len(chunks), seqlen), dtype=np.int64)
    r = np.zeros((len(chunks), seqlen), dtype=np.int64)
    lengths = np.zeros(len(chunks), dtype=np.int64)
    for row, (questions, responses) in enumerate(chunks):
        q[row, : len(questions)] = questions
        r[row, : len(responses)] = responses
        lengths[row] = len(questions)
    return Sequences(q, r, lengths)


def split_files(data_dir: Path, dataset: str, fold: int = 1) -> dict[str, Path]:
    """Paths of the train / valid fold, the published test split and the whole training split of a data set."""
    if dataset.startswith("synthetic"):
        version = int(dataset.removeprefix("synthetic-v") or 0)
        base = data_dir / "synthetic" / f"naive_c5_q50_s4000_v{version}"
    else:
        folder, prefix = DATASET_FILES[dataset]
        base = data_dir / folder / prefix
    return {
        "train": Path(f"{base}_train{fold}.csv"),
        "valid": Path(f"{base}_valid{fold}.csv"),
        "test": Path(f"{base}_test.csv"),
        "full": Path(f"{base}_train.csv"),
    }


def publishes_all_folds(data_dir: Path, dataset: str) -> bool:
    """Whether the data set ships all `CV_FOLDS` train/valid fold files (the synthetic sets ship only fold 1)."""
    return all(
        path.exists()
        for fold in range(1, CV_FOLDS + 1)
        for name, path in split_files(data_dir, dataset, fold).items()
        if name in ("train", "valid")
    )


def cv_split(students: list[Student], fold: int, seed: int = 0) -> tuple[list[Student], list[Student]]:
    """Fold `fold` (1-based) of a seeded `CV_FOLDS`-way split by student: (train, valid).

    Used for data sets that do not publish all five folds; every student is in exactly one valid fold.
    """
    if not 1 <= fold <= CV_FOLDS:
        raise ValueError(f"fold must be in 1..{CV_FOLDS}, got {fold}")
    order = np.random.default_rng(seed).permutation(len(students))
    held_out = set(order[fold - 1 :: CV_FOLDS].tolist())
    train = [s for i, s in enumerate(students) if i not in held_out]
    valid = [s for i, s in enumerate(students) if i in held_out]
    return train, valid
