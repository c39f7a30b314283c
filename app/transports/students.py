"""The /students endpoints: knowledge tracing with each student's state kept on the server (docs/students.md); an
append runs only the new interactions, from the stored memory, then stores the result by compare-and-swap."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, HTTPException, Path, Query, Request

from app.core.errors import InvalidInput
from app.core.responses import JsonResponse
from app.runtime.model import ServedModel
from app.runtime.offload import offload
from app.students.io import StoreHolder
from app.students.store import StateVersionMismatch, StudentState, UnreadableState, update_state
from app.tasks.knowledge_trace import schemas, service
from app.transports.deadline import within_deadline
from app.transports.http import json_body, read_body

router = APIRouter(tags=["students"])
MAX_PAGE_SIZE = 1000  # student ids per page of GET /students
MAX_STUDENT_ID_LENGTH = 128
# the id rules as far as a JSON Schema regex can state them, for OpenAPI: `student_id_problem` is the one check
STUDENT_ID_SCHEMA = {
    "minLength": 1,
    "maxLength": MAX_STUDENT_ID_LENGTH,
    "pattern": r"^(?!\.\.?$)[^\s/\x00-\x1f\x7f-\x9f\ufffd]+$",
}
STUDENT_ID_DESCRIPTION = f"an opaque id of 1 to {MAX_STUDENT_ID_LENGTH} printable characters, no '/' or spaces"
StudentIdPath = Annotated[str, Path(description=STUDENT_ID_DESCRIPTION, json_schema_extra=STUDENT_ID_SCHEMA)]


def student_id_problem(student_id: str) -> str | None:
    """The rule a student id breaks (docs/students.md), named without echoing the id; None for a valid id, which is
    then compared exactly as given (no trimming, case folding or normalisation)."""
    if not 1 <= len(student_id) <= MAX_STUDENT_ID_LENGTH:
        return f"student_id must be 1 to {MAX_STUDENT_ID_LENGTH} characters long; it has {len(student_id)}"
    for position, character in enumerate(student_id):
        if character.isspace() or not character.isprintable():
            return (
                "student_id must contain only printable characters other than whitespace; "
                f"character {position} is U+{ord(character):04X}"
            )
        if character == "/":
            return f"student_id must not contain '/' (it is one URL path segment); character {position}"
        if character == "\ufffd":  # what URL decoding makes of any byte that is not UTF-8: such ids would be one
            return f"student_id must be valid UTF-8 and must not contain U+FFFD; character {position} is U+FFFD"
    return "student_id must not be '.' or '..' (URL path segments)" if student_id in (".", "..") else None


def _holder(request: Request, student_id: str, location: tuple[str, str] = ("path", "student_id")) -> StoreHolder:
    """The app's store, once the id is checked: a 422 naming the parameter and the rule when it breaks one."""
    if problem := student_id_problem(student_id):
        raise InvalidInput(location, problem)
    return request.app.state.students


def _iso(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def memory_of(state: StudentState, model: ServedModel) -> np.ndarray:
    """The stored memory, if of the shape the model takes and finite: any other was not written by this service."""
    memory, taken = state.memory, model.state.init_memory.shape
    if memory.shape != taken:
        stored, taken_text = (" x ".join(map(str, shape)) for shape in (memory.shape, taken))
        raise UnreadableState(model.name, state.student_id, f"memory has shape {stored}; the model takes {taken_text}")
    if not np.isfinite(memory).all():
        raise UnreadableState(model.name, state.student_id, "memory holds nan or inf")
    return memory


@router.post(
    "/students/{student_id}/interactions",
    response_model=schemas.AppendResponse,
    openapi_extra=json_body(schemas.AppendRequest),
    operation_id="append_interactions",
)
async def append_interactions(request: Request, student_id: StudentIdPath) -> JsonResponse:
    """Append one or more interactions to a student's state (created on the first call).

    Returns the probability predicted for each new interaction before it was seen, the mastery after the
    last one, and predictions for `next_questions` if asked; also, on request, the attention of each new
    interaction and the mastery before and after each one. The state belongs to one version of the
    model: a state built by another version is a 409 (delete the student and replay the history).
    """
    holder = _holder(request, student_id)
    if "model" in request.query_params:  # GET's style: it would append under the default model
        raise InvalidInput(("query", "model"), "an append names its model in the body's field model, not the query")
    body = await read_body(request, schemas.AppendRequest, service.TASK_NAME)
    model = request.app.state.registry.get(body.model, service.TASK_NAME)
    questions, correct, wanted = await offload(
        service.request_arrays, model, body.interactions, body.next_questions or []
    )

    async def compute(current: StudentState | None) -> tuple[np.ndarray, int, tuple[dict, np.ndarray]]:
        """The new interactions from the stored memory, and `next_questions` predicted from the result: both before
        the write, since nothing may be cancelled once it is stored (a 504 would hide a stored append)."""
        memory = None if current is None else memory_of(current, model)
        (trace,) = await service.trace_all(model, [(questions, correct, memory)])
        final = trace[model.state.state_output]
        next_p = await service.predict_next(model, final, wanted) if len(wanted) else np.zeros(0)
        seen = 0 if current is None else current.interactions
        return final, seen + len(questions), (trace, next_p)

    async def append() -> dict[str, Any]:
        async with holder.writers.setdefault((model.name, student_id), asyncio.Lock()):
            state, (trace, next_p) = await update_state(
                holder,
                model.name,
                student_id,
                model.entry.sha256,
                compute,
                expected_interactions=body.expected_interactions,
            )
        return {
            "model": model.name,
            "interactions": state.interactions,
            "predictions": trace["p"].tolist(),
            "mastery": None if "mastery" not in trace else trace["mastery"][-1].tolist(),
            "next": service.question_items(model, wanted, next_p),
            "attention": trace["corr_w"].tolist()
            if body.return_attention and "corr_w" in trace
            else None,  # DKT: no slots
            "mastery_steps": trace["mastery"].tolist() if body.return_mastery_steps and "mastery" in trace else None,
        }

    rows = service.rows_needed(model, len(questions), len(wanted) > 0)
    with model.batcher.admit(rows, cells=len(questions) + len(wanted)):
        return JsonResponse(await within_deadline(append(), request.app.state, model.name, receive=request.receive))


@router.get("/students/{student_id}", response_model=schemas.StudentResponse, operation_id="get_student")
async def get_student(
    request: Request,
    student_id: StudentIdPath,
    model: Annotated[
        str | None, Query(max_length=64, description="a knowledge-trace model; null = the default")
    ] = None,
) -> JsonResponse:
    """A student's state under one model: interaction count, current mastery, times, model version."""
    holder = _holder(request, student_id)
    served = request.app.state.registry.get(model, service.TASK_NAME)

    async def describe() -> dict[str, Any]:
        if (state := await holder.read(lambda store: store.read(served.name, student_id))) is None:
            raise HTTPException(
                404,
                f"This student has no state under model {served.name}; "
                "POST /students/{student_id}/interactions creates it.",
            )
        if state.model_sha256 != served.entry.sha256:
            raise StateVersionMismatch(served.name, state.model_sha256, served.entry.sha256)
        mastery = await service.mastery_of(served, memory_of(state, served))
        return {
            "student_id": student_id,
            "model": served.name,
            "model_sha256": state.model_sha256,
            "interactions": state.interactions,
            "mastery": None if mastery is None else mastery.tolist(),
            "created_at": _iso(state.created_at),
            "updated_at": _iso(state.updated_at),
        }

    with served.batcher.admit(1):
        return JsonResponse(await within_deadline(describe(), request.app.state, served.name, receive=request.receive))


@router.delete("/students/{student_id}", response_model=schemas.DeleteResponse, operation_id="delete_student")
async def delete_student(request: Request, student_id: StudentIdPath) -> JsonResponse:
    """Erase everything about a student, under every model, at once; answers which states were removed."""
    holder = _holder(request, student_id)
    if "model" in request.query_params:  # GET's style: a client asking for one model's state would lose every model's
        raise InvalidInput(("query", "model"), "DELETE erases the student under every model; it takes no model")
    removed = await holder.commit(lambda store: store.delete(student_id))
    deleted = [{"model": model, "interactions": interactions} for model, interactions in removed.items()]
    return JsonResponse({"student_id": student_id, "deleted": deleted})


@router.get("/students", response_model=schemas.StudentList, operation_id="list_students")
async def list_students(
    request: Request,
    after: Annotated[
        str | None, Query(description="the `next_after` of the previous page", json_schema_extra=STUDENT_ID_SCHEMA)
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE, description="ids per page")] = 100,
) -> JsonResponse:
    """A page of the ids of students with a state, in ascending code-point order (keyset paging)."""
    holder = request.app.state.students if after is None else _holder(request, after, ("query", "after"))
    ids = await holder.read(lambda store: store.ids_after(after, limit + 1))  # one more: is there a next page?
    return JsonResponse({"student_ids": ids[:limit], "next_after": ids[limit - 1] if len(ids) > limit else None})
