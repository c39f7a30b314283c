"""A user's own answer log (CSV) for knowledge tracing: read, validate, number the questions, split by student.

The CSV has a header with `student`, `question` and `correct` (0/1/true/false), and optionally `order` or
`timestamp` (a number, or an ISO 8601 date-time read as UTC when it has no offset, one kind per student:
each student's answers are sorted by it, ties in file order), `question_name` and `skill` (a question's name in
the catalog: from its first row that has a `question_name`, or else a `skill`). Question ids are the user's own,
integers or strings: the model numbers them 1..Q internally, and serving maps the user's ids through the model's
`question_ids` asset, so ids and names hold no control character (numpy drops trailing NULs, and a request could
not send a newline back as the same id). Every problem raises `AnswerLogError`, one line naming the file and,
where it applies, the line and the column.
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from app.tasks.knowledge_trace.schemas import MAX_QUESTION_ID, MAX_QUESTION_TEXT
from models.kt_data import Student
from models.user_csv import OwnDataError, read_records, split_keys

REQUIRED = ("student", "question", "correct")
ORDER_COLUMNS = ("order", "timestamp")
NAME_COLUMNS = ("question_name", "skill")
TRUE, FALSE = frozenset({"1", "true"}), frozenset({"0", "false"})
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
    order_kind: str  # "number" or "date-time": what the order cell holds ("" without an order column)
    name: str  # the row's question_name, else its skill, else ""


def read_answer_log(path: Path) -> AnswerLog:
    """Parse and validate the CSV at `path`."""
    names, records = read_records(path, REQUIRED)
    orders = [name for name in ORDER_COLUMNS if name in names]
    if len(orders) > 1:
        raise AnswerLogError(f"{path}:1: give either 'order' or 'timestamp', not both")
    columns = {"order": orders[0] if orders else "", **{name: name for name in NAME_COLUMNS if name in names}}
    rows = [_row(path, line, record, columns) for line, record in records]
    first: dict[str, Row] = {}
    for row in rows:
        seen = first.setdefault(row.student, row)
        if row.order_kind != seen.order_kind:
            raise AnswerLogError(
                f"{path}:{row.line}: column {columns['order']!r} is a {row.order_kind}, but line {seen.line} of "
                f"student {row.student!r} holds a {seen.order_kind}: give one student's answers one kind"
            )
    return _assemble(rows)


def _row(path: Path, line: int, record: dict[str, str], columns: dict[str, str]) -> Row:
    """One validated row; `line` is the CSV line it ends on."""
    correct = record["correct"].lower()
    if correct not in TRUE | FALSE:
        raise AnswerLogError(f"{path}:{line}: column 'correct' is {record['correct']!r}, not 0, 1, true or false")
    order, kind = _order(path, line, columns["order"], record[columns["order"]]) if columns["order"] else (line, "")
    if len(record["question"]) > MAX_QUESTION_TEXT:
        raise AnswerLogError(
            f"{path}:{line}: column 'question' has {len(record['question'])} characters; a request's question id has "
            f"at most {MAX_QUESTION_TEXT}"
        )
    for column in ("question", *NAME_COLUMNS):
        if any(unicodedata.category(character) == "Cc" for character in record.get(column, "")):
            raise AnswerLogError(f"{path}:{line}: column {column!r} holds a control character (a NUL, tab or newline)")
    name = next((record[column] for column in NAME_COLUMNS if column in columns and record[column]), "")
    return Row(line, record["student"], record["question"], int(correct in TRUE), order, kind, name)


def _order(path: Path, line: int, column: str, text: str) -> tuple[float, str]:
    """The sort key of an `order` (a number) or `timestamp` (a number or an ISO 8601 date-time, UTC unless it
    gives an offset) cell, and which of the two it is."""
    if not text:
        raise AnswerLogError(f"{path}:{line}: column {column!r} is empty")
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if math.isfinite(value):
        return value, "number"
    if column == "timestamp":
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            pass
        else:
            return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp(), "date-time"
    expected = "a number or an ISO 8601 date-time" if column == "timestamp" else "a number"
    raise AnswerLogError(f"{path}:{line}: column {column!r} is {text!r}, not {expected}")


def _assemble(rows: list[Row]) -> AnswerLog:
    """Number the questions (integers in numeric order when every id is one, else strings in text order) and
    build each student's history in answer order."""
    texts = sorted({row.question for row in rows})
    if all(INTEGER_ID.fullmatch(text) and int(text) <= MAX_QUESTION_ID for text in texts):
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
    """Student ids of the train, valid and test splits (models/user_csv.py: `split_keys`); AUC needs right and
    wrong answers in the validation and test splits."""
    splits = split_keys(list(log.students), seed, "student")
    for name in ("valid", "test"):
        answers = {answer for student in splits[name] for answer in log.students[student].responses}
        if len(answers) < 2:
            raise AnswerLogError(
                f"the {name} split ({len(splits[name])} students) has only {'correct' if 1 in answers else 'wrong'} "
                "answers, so its AUC is undefined: the CSV needs more students"
            )
    return splits
