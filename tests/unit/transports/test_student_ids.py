"""The student id rules (docs/students.md): kept as given when valid, else the rule named without the id."""

from __future__ import annotations

import pytest

from app.transports.students import student_id_problem


@pytest.mark.parametrize(
    "student_id", ["s", "student-42", "élève_7", "学生", "a:b@c.d+e~f", "Ünïcödé…", "x" * 128, "%2F", "..."]
)
def test_valid_student_ids_are_kept_as_given(student_id: str) -> None:
    assert student_id_problem(student_id) is None


@pytest.mark.parametrize(
    ("student_id", "message"),
    [
        ("", "1 to 128 characters long; it has 0"),
        ("x" * 129, "1 to 128 characters long; it has 129"),
        ("secret name", "character 6 is U+0020"),
        ("tab\there", "character 3 is U+0009"),
        ("line\n", "character 4 is U+000A"),
        ("nbsp\u00a0", "character 4 is U+00A0"),
        ("zero\u200bwidth", "character 4 is U+200B"),
        ("del\x7f", "character 3 is U+007F"),
        ("lone\ud800", "character 4 is U+D800"),
        ("a/b", "must not contain '/'"),
        ("bad\ufffdbyte", "valid UTF-8 and must not contain U+FFFD; character 3 is U+FFFD"),
        ("..", "must not be '.' or '..'"),
        (".", "must not be '.' or '..'"),
    ],
)
def test_invalid_student_ids_name_the_rule_without_echoing_the_id(student_id: str, message: str) -> None:
    problem = student_id_problem(student_id)
    assert problem is not None and message in problem and problem.startswith("student_id must")
    if len(student_id) > 2:
        assert student_id not in problem
