"""The knowledge-tracing task's JSON API: POST /knowledge-trace (admitted and answered through
app/transports/http.py), and GET /models/{name}/questions."""

from __future__ import annotations

from typing import Annotated

import numpy as np
from fastapi import APIRouter, Path, Query, Request

from app.core.responses import JsonResponse, dumps
from app.runtime.collate import Feeds
from app.runtime.model import Admission, Endpoint, ServedModel
from app.runtime.offload import offload_if
from app.tasks.knowledge_trace import schemas, service

MAX_CATALOG_PAGE = 1000
INLINE_INTERACTIONS = 1000  # shorter histories are converted on the loop: cheaper than a hop
INLINE_RENDER_NUMBERS = 20_000  # answers of fewer numbers render on the loop: no thread hop
NEXT_ITEM_NUMBERS = 10  # a `next` item (a dict) takes about as long to build and render as 10 array numbers
MASTERY_ROWS = {"all": slice(None), "last": slice(-1, None), "none": None}
routes = APIRouter()  # tagged with the task's tag by app/transports/http.py
DESCRIPTION = """Predict each interaction from the ones before it, then the next questions; report concept mastery.

Histories longer than the model's `seqlen` (GET /models) are processed in consecutive chunks of
`seqlen`, oldest first, each chunk starting from the memory state the previous one ended with.
A DKT model (`family` dkt) has no memory slots: its `mastery`, `attention`, `n_concepts` and `next[].concept`
are null whatever the request asks (GET /models `supports` says which fields a model fills)."""


def _admission(model: ServedModel, body: schemas.KnowledgeTraceRequest) -> Admission:
    next_count = model.state.n_questions if body.next_questions is None else len(body.next_questions)
    rows = service.rows_needed(model, len(body.interactions), next_count > 0)
    return model.batcher.admit(rows, cells=len(body.interactions) + next_count)


async def _answer(model: ServedModel, body: schemas.KnowledgeTraceRequest, alone: bool) -> bytes:
    long_history = len(body.interactions) > INLINE_INTERACTIONS
    fields = (body.interactions, body.next_questions)
    questions, correct, wanted = await offload_if(long_history, service.request_arrays, model, *fields)
    body.interactions.clear()  # now in the arrays: the history's dicts are not held while it runs and renders
    (trace,) = await service.trace_all(model, [(questions, correct, None)])
    next_p = await service.predict_next(model, trace[model.state.state_output], wanted) if len(wanted) else np.zeros(0)
    per_step = 1 + (model.state.n_concepts or 0) * (body.return_attention + (body.mastery == "all"))
    numbers = len(questions) * per_step + len(wanted) * NEXT_ITEM_NUMBERS
    return await offload_if(numbers > INLINE_RENDER_NUMBERS, render, model, body, trace, wanted, next_p)


def json_floats(array: np.ndarray | None) -> np.ndarray | None:
    """Float64 rounded to 7 decimals (float32's resolution near 1): orjson writes it faster and shorter than float32."""
    return None if array is None else (wide := array.astype(np.float64)).round(7, out=wide)


def render(
    model: ServedModel, body: schemas.KnowledgeTraceRequest, trace: Feeds, wanted: np.ndarray, next_p: np.ndarray
) -> bytes:
    """The response's JSON."""
    rows = MASTERY_ROWS[body.mastery]
    return dumps(
        {
            "model": model.name,
            "family": model.state.family,
            "n_concepts": model.state.n_concepts,
            "predictions": json_floats(trace["p"]) if body.return_predictions else None,
            "next": service.question_items(model, wanted, next_p),
            "mastery": None if "mastery" not in trace or rows is None else json_floats(trace["mastery"][rows]),
            "attention": json_floats(trace.get("corr_w")) if body.return_attention else None,
        }
    )


ENDPOINTS = (
    Endpoint(
        path="/knowledge-trace",
        operation_id="knowledge_trace",
        request=schemas.KnowledgeTraceRequest,
        response=schemas.KnowledgeTraceResponse,
        description=DESCRIPTION,
        admit=_admission,
        answer=_answer,
    ),
)


@routes.get("/models/{name}/questions", response_model=schemas.QuestionCatalog, operation_id="list_questions")
async def questions(
    request: Request,
    name: Annotated[str, Path(max_length=64, description="a knowledge-trace model from GET /models")],
    offset: Annotated[int, Query(ge=0, le=schemas.MAX_QUESTION_ID, description="questions to skip")] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_CATALOG_PAGE, description="questions per page")] = 100,
) -> JsonResponse:
    """A page of the model's question catalog: id, name where the data set has one, main concept."""
    model = request.app.state.registry.get(name, service.TASK_NAME)
    return JsonResponse(service.catalog(model, offset, limit))
