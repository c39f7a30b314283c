// A student kept on the server (/students/{id}): the id rules of the API, reading a student and appending answers.
import { request } from "./api.js";

const MAX_LENGTH = 128;
// Python's str.isprintable() and not str.isspace(): no Other (C*: control, format, surrogate, private, unassigned)
// and no Separator (Z*: spaces, line and paragraph separators) characters.
const NOT_ALLOWED = /[\p{C}\p{Z}]/u;

const hex = (character) => `U+${character.codePointAt(0).toString(16).toUpperCase().padStart(4, "0")}`;

/** Why `id` is not a valid student id, in the API's words (app/transports/students.py), or null when it is valid. */
export function studentIdProblem(id) {
  const characters = [...id]; // code points, as the API counts them
  if (characters.length < 1 || characters.length > MAX_LENGTH) {
    return `student_id must be 1 to ${MAX_LENGTH} characters long; it has ${characters.length}`;
  }
  for (const [position, character] of characters.entries()) {
    if (NOT_ALLOWED.test(character)) {
      return `student_id must contain only printable characters other than whitespace; character ${position} is ${hex(character)}`;
    }
    if (character === "/") return `student_id must not contain '/' (it is one URL path segment); character ${position}`;
    if (character === "\ufffd") {
      return `student_id must be valid UTF-8 and must not contain U+FFFD; character ${position} is U+FFFD`;
    }
  }
  if (id === "." || id === "..") return "student_id must not be '.' or '..' (URL path segments)";
  return null;
}

const path = (id) => `students/${encodeURIComponent(id)}`;

/** The student's stored state under `model` (count, current mastery, times); rejects with ApiError (404: none). */
export function readStudent(id, model) {
  return request(`${path(id)}?model=${encodeURIComponent(model)}`);
}

/** Append `interactions` to the student (created if new), with every per-step output and `next` predictions. */
export function appendToStudent(id, model, interactions, nextQuestions) {
  return request(`${path(id)}/interactions`, {
    model, interactions, next_questions: nextQuestions, return_attention: true, return_mastery_steps: true,
  });
}
