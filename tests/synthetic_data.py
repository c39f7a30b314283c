"""Small generated data sets in the real file formats, so tests never read ../shared."""

from __future__ import annotations

import random
from pathlib import Path

SICK_HEADER = "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n"
_SUBJECTS = ["a man", "a woman", "the dog", "a child", "two people", "the cat"]
_VERBS = ["is playing", "is eating", "is riding", "is watching", "is cutting", "is holding"]
_OBJECTS = ["a guitar", "an apple", "a horse", "the television", "a tomato", "a ball"]


def _sentence(rng: random.Random) -> tuple[int, int, int]:
    return rng.randrange(6), rng.randrange(6), rng.randrange(6)


def write_sick(directory: Path, sizes: tuple[int, int, int] = (48, 16, 16), seed: int = 0) -> Path:
    """SICK_train/trial/test_annotated files whose relatedness grows with the number of shared parts."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    names = ("SICK_train.txt", "SICK_trial.txt", "SICK_test_annotated.txt")
    pair_id = 1
    for name, size in zip(names, sizes, strict=True):
        rows = [SICK_HEADER]
        for _ in range(size):
            a, b = _sentence(rng), _sentence(rng)
            if rng.random() < 0.4:
                b = a
            shared = sum(x == y for x, y in zip(a, b, strict=True))
            label = "ENTAILMENT" if shared == 3 else ("NEUTRAL" if shared else "CONTRADICTION")
            text_a = f"{_SUBJECTS[a[0]]} {_VERBS[a[1]]} {_OBJECTS[a[2]]}."
            text_b = f"{_SUBJECTS[b[0]]} {_VERBS[b[1]]} {_OBJECTS[b[2]]}"
            rows.append(f"{pair_id}\t{text_a}\t{text_b}\t{1 + 4 * shared / 3:.1f}\t{label}\n")
            pair_id += 1
        (directory / name).write_text("".join(rows))
    return directory


MSRP_HEADER = "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\r\n"


def write_msrp(directory: Path, sizes: tuple[int, int] = (60, 20), seed: int = 0) -> Path:
    """msr_paraphrase_train/test files (byte-order mark, CRLF, a stray quote) labelled 1 where the two sentences
    differ in at most one part."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    names = ("msr_paraphrase_train.txt", "msr_paraphrase_test.txt")
    for name, size in zip(names, sizes, strict=True):
        rows = [MSRP_HEADER]
        for index in range(size):
            a, b = _sentence(rng), _sentence(rng)
            if rng.random() < 0.5:
                b = (*a[:2], b[2])
            label = int(sum(x == y for x, y in zip(a, b, strict=True)) >= 2)
            text_a = f'{_SUBJECTS[a[0]]} "{_VERBS[a[1]]} {_OBJECTS[a[2]]}.'
            text_b = f"{_SUBJECTS[b[0]]} {_VERBS[b[1]]} {_OBJECTS[b[2]]}"
            rows.append(f"{label}\t{2 * index}\t{2 * index + 1}\t{text_a}\t{text_b}\r\n")
        (directory / name).write_bytes("".join(rows).encode())
    return directory


def write_kt_students(path: Path, n_students: int, n_questions: int, max_len: int, seed: int = 0) -> Path:
    """A three-line CSV: each student has a skill level; harder (higher-id) questions fail more often."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n_students):
        length = rng.randint(2, max_len)
        skill = rng.random()
        questions = [rng.randint(1, n_questions) for _ in range(length)]
        answers = [int(rng.random() < 0.2 + 0.6 * skill * (1 - q / (n_questions + 1)) + 0.2 * skill) for q in questions]
        lines += [str(length), ",".join(map(str, questions)) + ",", ",".join(map(str, answers))]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def write_synthetic_kt(data_dir: Path, n_questions: int = 50, seed: int = 0) -> Path:
    """The synthetic-v0 file set (train1, valid1, test, cluster_info_0) with small sizes."""
    stem = data_dir / "synthetic" / "naive_c5_q50_s4000_v0"
    write_kt_students(Path(f"{stem}_train1.csv"), 64, n_questions, 50, seed)
    write_kt_students(Path(f"{stem}_valid1.csv"), 16, n_questions, 50, seed + 1)
    write_kt_students(Path(f"{stem}_test.csv"), 16, n_questions, 50, seed + 2)
    clusters = [q % 5 for q in range(n_questions)]
    (data_dir / "synthetic" / "cluster_info_0").write_text(str(clusters) + "\n")
    return data_dir


def write_answer_log(path: Path, students: int = 60, questions: int = 12, answers: int = 25, seed: int = 0) -> Path:
    """A `mnemo train kt` CSV: sparse string question ids (`item-<n>`), names, timestamps out of file order, and
    answers drawn from a student ability against a question difficulty (so the order of answers carries signal)."""
    rng = random.Random(seed)
    ids = [f"item-{rng.randrange(10_000, 99_999)}" for _ in range(questions)]
    difficulty = {question: rng.gauss(0, 1) for question in ids}
    rows = ["student,question,correct,timestamp,question_name"]
    for student in range(students):
        ability = rng.gauss(0, 1)
        for step in rng.sample(range(answers), answers):  # file order is not answer order
            question = rng.choice(ids)
            p = 1 / (1 + 2.718281828 ** (difficulty[question] - ability - 0.05 * step))
            correct = rng.choice(["true", "1"]) if rng.random() < p else rng.choice(["false", "0"])
            rows.append(f"s{student},{question},{correct},{1_700_000_000 + 60 * step},Question {question[5:]}")
    path.write_text("\n".join(rows) + "\n")
    return path
