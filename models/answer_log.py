"""A user's own answer log (CSV) for knowledge tracing: read, validate, number the questions, split by student.

The CSV has a header with `student`, `question` and `correct` (0/1/true/false), and optionally `order` or
`timestamp` (a number or an ISO 8601 date-time: each student's answers are sorted by it, ties in file order),
`question_name` and `skill` (a question's name in the catalog: from its first row that has a `question_name`, or
else a `skill`). Question ids are the user's own, integers or strings: the model numbers them 1..Q internally,
and serving maps the user's ids through the model's `question_ids` asset. Every problem raises
`AnswerLogError`, one line naming the file and, where it applies, the line and the column.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from models.kt_data import Student
from models.user_csv import OwnDataError, read_records, split_keys

REQUIRED = ("student", "question", "correct")
ORDER_COLUMNS = ("order", "timestamp")
NAME_COLUMNS = ("question_name", "skill")
TRUE, FALSE = frozenset({"1", "true"}), frozenset({"0", "false"})
MAX_INTEGER_ID = 2**31 - 1  # the API's integer question ids are 1..2^31-1; other ids are served as strings
INTEGER_ID = re.compile(r"[1-9][0-9]*")  # no sign, no leading zero: the id reads back as the same text
AnswerLogError = OwnDataError


@dataclass(frozen=True)
class AnswerLog:
    """Every student's history with questions numbered 1..Q, and what question k (1-based) is to the user."""

    students: dict[str, Student]  # by the user's student id, answers in order
    question_ids: list[int] | list[str]  # the user's id of question k at index k-1 (sorted)
    question_names: list[str]  # "" where the CSV names none

    @property
    def n_questions(self) -> int:
        return len(self.question_ids)

    @property
    def n_answers(self) -> int:
        return sum(len(student.questions) for student in self.students.values())


@dataclass(frozen=True)
class Row:
    line: int
    student: str
    question: str
    correct: int
    order: float
    name: str  # the row's question_name, else its skill, else ""


def read_answer_log(path: Path) -> AnswerLog:
    """Parse and validate the CSV at `path`."""
    names, records = read_records(path, REQUIRED)
    orders = [name for name in ORDER_COLUMNS if name in names]
    if len(orders) > 1:
        raise AnswerLogError(f"{path}:1: give either 'order' or 'timestamp', not both")
    columns = {"order": orders[0] if orders else "", **{name: name for name in NAME_COLUMNS if name in names}}
    return _assemble([_row(path, line, record, columns) for line, record in records])


def _row(path: Path, line: int, record: dict[str, str], columns: dict[str, str]) -> Row:
    """One validated row; `line` is the CSV line it ends on."""
    correct = record["correct"].lower()
    if correct not in TRUE | FALSE:
        raise AnswerLogError(f"{path}:{line}: column 'correct' is {record['correct']!r}, not 0, 1, true or false")
    order = _order(path, line, columns["order"], record[columns["order"]]) if columns["order"] else float(line)
    name = next((record[column] for column in NAME_COLUMNS if column in columns and record[column]), "")
    return Row(line, record["student"], record["question"], int(correct in TRUE), order, name)


def _order(path: Path, line: int, column: str, text: str) -> float:
    """The sort key of an `order` (a number) or `timestamp` (a number or an ISO 8601 date-time) cell."""
    if not text:
        raise AnswerLogError(f"{path}:{line}: column {column!r} is empty")
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if math.isfinite(value):
        return value
    if column == "timestamp":
        try:
            return datetime.fromisoformat(text).timestamp()
        except ValueError:
            pass
    expected = "a number or an ISO 8601 date-time" if column == "timestamp" else "a number"
    raise AnswerLogError(f"{path}:{line}: column {column!r} is {text!r}, not {expected}")


def _assemble(rows: list[Row]) -> AnswerLog:
    """Number the questions (integers in numeric order when every id is one, else strings in text order) and
    build each student's history in answer order."""
    texts = sorted({row.question for row in rows})
    if all(INTEGER_ID.fullmatch(text) and int(text) <= MAX_INTEGER_ID for text in texts):
        texts.sort(key=int)
        ids: list[int] | list[str] = [int(text) for text in texts]
    else:
        ids = texts
    index = {text: number for number, text in enumerate(texts, start=1)}
    names: dict[str, str] = {}
    for row in rows:
        if row.name and row.question not in names:
            names[row.question] = row.name
    by_student: dict[str, list[Row]] = {}
    for row in rows:
        by_student.setdefault(row.student, []).append(row)
    students = {}
    for student, answers in by_student.items():
        answers.sort(key=lambda row: (row.order, row.line))
        students[student] = Student([index[row.question] for row in answers], [row.correct for row in answers])
    return AnswerLog(students, ids, [names.get(text, "") for text in texts])


def split_students(log: AnswerLog, seed: int) -> dict[str, list[str]]:
    """Student ids of the train, valid and test splits (models/user_csv.py: `split_keys`)."""
    return split_keys(list(log.students), seed, "student")
