"""POST /knowledge-trace and GET /models/{name}/questions: the thin HTTP adapter over the KT service."""

from __future__ import annotations

from functools import partial
from typing import Annotated

import numpy as np
from fastapi import APIRouter, Path, Query, Request

from app.core.responses import JsonResponse, dumps
from app.runtime.model import ServedModel
from app.runtime.offload import offload_if
from app.tasks.knowledge_trace import service
from app.tasks.knowledge_trace.schemas import (
    MAX_QUESTION_ID,
    KnowledgeTraceRequest,
    KnowledgeTraceResponse,
    QuestionCatalog,
)
from app.transports.http import complete, json_body, read_body, registry

TASK_NAME = "knowledge-trace"
MAX_CATALOG_PAGE = 1000
router = APIRouter(tags=["knowledge tracing"])
INLINE_INTERACTIONS = 1000  # shorter histories are converted on the loop: cheaper than a hop
INLINE_RENDER_NUMBERS = 20_000  # cheaper answers (service.answer_numbers) render on the loop: no thread hop
MASTERY_ROWS = {"all": lambda rows: rows, "last": lambda rows: rows[-1:], "none": lambda rows: None}


def arrays_of(model: ServedModel, body: KnowledgeTraceRequest) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Questions, answers and the questions to predict next, checked against the model."""
    if body.next_questions is None:
        wanted = np.arange(1, model.state.n_questions + 1, dtype=np.int64)
    else:
        wanted = np.array(body.next_questions, dtype=np.int64)
    questions, correct = service.request_arrays(model, body.interactions, wanted)
    return questions, correct, wanted


async def _answer(model: ServedModel, body: KnowledgeTraceRequest, arrays) -> bytes:
    questions, correct, wanted = arrays
    trace = await service.trace(model, questions, correct)
    next_p = await service.predict_next(model, trace.memory, wanted) if len(wanted) else np.zeros(0)
    render = partial(answer, model, body, trace, wanted, next_p)
    mastery_rows = {"all": len(trace.predictions) + 1, "last": 1, "none": 0}[body.mastery]
    numbers = service.answer_numbers(trace, len(wanted), body.return_attention, mastery_rows)
    return await offload_if(numbers > INLINE_RENDER_NUMBERS, render)


def answer(
    model: ServedModel, body: KnowledgeTraceRequest, trace: service.Trace, wanted: np.ndarray, next_p: np.ndarray
) -> bytes:
    """The response's JSON."""
    return dumps(
        {
            "model": model.name,
            "family": model.state.family.name,
            "n_concepts": model.state.n_concepts,
            "predictions": trace.predictions if body.return_predictions else None,
            "next": service.next_items(model, wanted, next_p),
            "mastery": None if trace.mastery is None else MASTERY_ROWS[body.mastery](trace.mastery),
            "attention": trace.attention if body.return_attention else None,
        }
    )


@router.post(
    "/knowledge-trace",
    response_model=KnowledgeTraceResponse,
    openapi_extra=json_body(KnowledgeTraceRequest),
    operation_id="knowledge_trace",
)
async def knowledge_trace(request: Request) -> JsonResponse:
    """Predict each interaction from the ones before it, then the next questions; report concept mastery.

    Histories longer than the model's `seqlen` (GET /models) are processed in consecutive chunks of
    `seqlen`, oldest first, each chunk starting from the memory state the previous one ended with.
    A DKT model (`family` dkt) has no memory slots: its `mastery`, `attention`, `n_concepts` and `next[].concept`
    are null whatever the request asks (GET /models `supports` says which fields a model fills).
    """
    body = await read_body(request, KnowledgeTraceRequest, TASK_NAME)
    model = registry(request).get(body.model, TASK_NAME)
    next_count = model.state.n_questions if body.next_questions is None else len(body.next_questions)
    rows = service.rows_needed(model, len(body.interactions), next_count > 0)
    with model.batcher.admit(rows, cells=len(body.interactions) + next_count):
        arrays = await offload_if(len(body.interactions) > INLINE_INTERACTIONS, arrays_of, model, body)
        return JsonResponse(await complete(request, _answer(model, body, arrays), model.name))


@router.get("/models/{name}/questions", response_model=QuestionCatalog, operation_id="list_questions")
async def questions(
    request: Request,
    name: Annotated[str, Path(max_length=64, description="a knowledge-trace model from GET /models")],
    offset: Annotated[int, Query(ge=0, le=MAX_QUESTION_ID, description="questions to skip")] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_CATALOG_PAGE, description="questions per page")] = 100,
) -> JsonResponse:
    """A page of the model's question catalog: id, name where the data set has one, main concept."""
    model = registry(request).get(name, TASK_NAME)
    return JsonResponse(service.catalog(model, offset, limit))
