"""Student ids: opaque strings chosen by the client, validated before they reach a store or a URL.

Rules (docs/students.md):
- 1 to 128 characters (Unicode code points, so at most 512 bytes of UTF-8).
- Every character printable (`str.isprintable`: letters, marks, numbers, punctuation, symbols of any
  script) and none of them whitespace: no spaces, tabs, newlines, control or format characters, no
  unpaired surrogates.
- No `/`, and not `.` or `..`: the id is one path segment of `/students/{student_id}`, and clients and
  proxies rewrite those.
- No U+FFFD: the URL decoding turns every byte sequence that is not UTF-8 into it, so `%FF` and `%FE`
  would name one student.
- Compared exactly as given: no trimming, case folding or Unicode normalisation (`é` composed and
  decomposed are two ids).

Messages name the rule and the limit but never echo the id (no student text in logs).
"""

from __future__ import annotations

MAX_STUDENT_ID_LENGTH = 128
RESERVED_STUDENT_IDS = frozenset({".", ".."})
# What the server's URL decoding makes of bytes that are not UTF-8 (%FF, an encoded lone surrogate): refused, or
# every such id would be the same student.
REPLACEMENT_CHARACTER = "\ufffd"
# The rules as far as a JSON Schema regex can state them, for the OpenAPI document: no whitespace, no '/', no
# C0/C1 control character, not '.' or '..'. "Printable" (no format, unassigned or private-use characters) has
# no portable regex form: `validate_student_id` is the one check.
STUDENT_ID_SCHEMA = {
    "minLength": 1,
    "maxLength": MAX_STUDENT_ID_LENGTH,
    "pattern": r"^(?!\.\.?$)[^\s/\x00-\x1f\x7f-\x9f\ufffd]+$",
}


class InvalidStudentId(ValueError):
    """A student id that breaks the rules above; the message says which (pydantic turns it into a 422)."""


def validate_student_id(student_id: str) -> str:
    """Return `student_id` unchanged if it is valid, else raise `InvalidStudentId` naming the rule."""
    if not isinstance(student_id, str):
        raise InvalidStudentId(f"student_id must be a string, not {type(student_id).__name__}")
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
    if student_id in RESERVED_STUDENT_IDS:
        raise InvalidStudentId("student_id must not be '.' or '..' (URL path segments)")
    return student_id
