"""Student ids: opaque strings chosen by the client, checked before they reach a store or a URL (the rules and
their reasons: docs/students.md). Compared exactly as given; messages name the rule, never the id."""

from __future__ import annotations

MAX_STUDENT_ID_LENGTH = 128
REPLACEMENT_CHARACTER = "\ufffd"  # what URL decoding makes of any byte that is not UTF-8: every such id would be one
# The rules as far as a JSON Schema regex can state them, for the OpenAPI document ("printable" has no portable form).
STUDENT_ID_SCHEMA = {
    "minLength": 1,
    "maxLength": MAX_STUDENT_ID_LENGTH,
    "pattern": r"^(?!\.\.?$)[^\s/\x00-\x1f\x7f-\x9f\ufffd]+$",
}


class InvalidStudentId(ValueError):
    """A student id that breaks a rule; the message says which."""


def validate_student_id(student_id: str) -> str:
    """Return `student_id` unchanged if it is valid, else raise `InvalidStudentId` naming the rule."""
    if not 1 <= len(student_id) <= MAX_STUDENT_ID_LENGTH:
        raise InvalidStudentId(
            f"student_id must be 1 to {MAX_STUDENT_ID_LENGTH} characters long; it has {len(student_id)}"
        )
    for position, character in enumerate(student_id):
        if character.isspace() or not character.isprintable():
            raise InvalidStudentId(
                f"student_id must contain only printable characters other than whitespace; "
                f"character {position} is U+{ord(character):04X}"
            )
        if character == "/":
            raise InvalidStudentId(
                f"student_id must not contain '/' (it is one URL path segment); character {position}"
            )
        if character == REPLACEMENT_CHARACTER:
            raise InvalidStudentId(
                f"student_id must be valid UTF-8 and must not contain U+FFFD; character {position} is U+FFFD"
            )
    if student_id in (".", ".."):
        raise InvalidStudentId("student_id must not be '.' or '..' (URL path segments)")
    return student_id
