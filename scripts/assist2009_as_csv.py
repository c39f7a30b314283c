"""Rewrite ASSISTments 2009 (the DKVMN authors' three-line files) as a `mnemo train kt` CSV with sparse string
question ids, to try the own-data path on real answers: `student,question,correct,order,question_name`.

    python scripts/assist2009_as_csv.py ../shared/data/kt/assist2009_updated assist2009_own.csv

Question k becomes `skill-<5 digits>` (a seeded, sparse choice) named by the skill mapping; students are numbered
in file order over the train then test files, so the CSV carries no trace of the published split.
"""

from __future__ import annotations

import csv
import random
import sys
from pathlib import Path

from models.kt_data import read_students


def main(source: Path, target: Path) -> None:
    prefix = source / source.name
    students = read_students(Path(f"{prefix}_train.csv")) + read_students(Path(f"{prefix}_test.csv"))
    mapping = (source / f"{source.name}_skill_mapping.txt").read_text().splitlines()
    names = {int(line.split("\t")[0]): line.split("\t")[1].strip() for line in mapping if "\t" in line}
    n_questions = max(max(student.questions) for student in students)
    sparse = random.Random(2009).sample(range(10_000, 100_000), n_questions)
    ids = {question: f"skill-{sparse[question - 1]}" for question in range(1, n_questions + 1)}
    with target.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["student", "question", "correct", "order", "question_name"])
        for number, student in enumerate(students):
            for order, (question, correct) in enumerate(zip(student.questions, student.responses, strict=True)):
                writer.writerow([f"u{number}", ids[question], correct, order, names.get(question, "")])
    answers = sum(len(student.questions) for student in students)
    print(f"{target}: {answers} answers, {len(students)} students, {n_questions} questions")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
