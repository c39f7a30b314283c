"""POST /knowledge-trace: DKVMN predictions, concept mastery and attention for one student's history."""

from __future__ import annotations

import numpy as np
from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from app.errors import InvalidInput
from app.inference.knowledge_trace import predict_next, trace_history
from app.schemas.knowledge_trace import KnowledgeTraceRequest, KnowledgeTraceResponse, NextPrediction

TASK = "knowledge-trace"
router = APIRouter(tags=["knowledge tracing"])


def prepare(model, settings) -> None:
    """Check the model's assets and keep what every request needs."""
    n_questions = int(model.metadata["n_questions"])
    names = model.assets.get("question_names")
    model.state["question_names"] = [str(name) or None for name in names] if names is not None else None
    model.state["concepts"] = model.assets["question_concepts"].astype(int).tolist()
    model.state["all_questions"] = np.arange(1, n_questions + 1, dtype=np.int64)
    if len(model.state["concepts"]) != n_questions:
        raise ValueError(f"{model.name}: question_concepts has {len(model.state['concepts'])} rows, not {n_questions}")


def _check_questions(body: KnowledgeTraceRequest, model_name: str, n_questions: int) -> None:
    """Question ids above the model's range are a 422 naming the item and the range."""
    for index, item in enumerate(body.interactions):
        if item.question > n_questions:
            raise InvalidInput(
                ("body", "interactions", index, "question"),
                f"question {item.question} is outside 1..{n_questions}, the questions of model {model_name}",
            )
    for index, question in enumerate(body.next_questions or []):
        if not 1 <= question <= n_questions:
            raise InvalidInput(
                ("body", "next_questions", index),
                f"question {question} is outside 1..{n_questions}, the questions of model {model_name}",
            )


def _infer(model, body: KnowledgeTraceRequest) -> KnowledgeTraceResponse:
    """The whole computation (runs in a worker thread)."""
    questions = np.array([item.question for item in body.interactions], dtype=np.int64)
    correct = np.array([item.correct for item in body.interactions], dtype=np.int64)
    trace = trace_history(model.run, model.assets["init_memory"], int(model.metadata["seqlen"]), questions, correct)
    wanted = (
        np.array(body.next_questions, dtype=np.int64)
        if body.next_questions is not None
        else model.state["all_questions"]
    )
    next_p = predict_next(model.run, trace.memory, wanted) if len(wanted) else np.zeros(0)
    names = model.state["question_names"]
    return KnowledgeTraceResponse(
        model=model.name,
        n_concepts=int(model.metadata["n_concepts"]),
        predictions=trace.predictions.tolist(),
        next=[
            NextPrediction(
                question=int(q),
                p_correct=float(p),
                concept=model.state["concepts"][q - 1],
                name=names[q - 1] if names else None,
            )
            for q, p in zip(wanted, next_p, strict=True)
        ],
        mastery=trace.mastery.tolist(),
        attention=trace.attention.tolist() if body.return_attention else None,
    )


@router.post("/knowledge-trace", response_model=KnowledgeTraceResponse)
async def knowledge_trace(body: KnowledgeTraceRequest, request: Request) -> KnowledgeTraceResponse:
    """Predict each interaction from the ones before it, then the next questions; report concept mastery.

    Histories longer than the model's `seqlen` (GET /models) are processed in consecutive chunks of
    `seqlen`, oldest first, each chunk starting from the memory state the previous one ended with.
    """
    model = request.app.state.registry.get(body.model, TASK)
    _check_questions(body, model.name, int(model.metadata["n_questions"]))
    return await run_in_threadpool(_infer, model, body)
