"""Bodies of the /students endpoints: per-student knowledge tracing with the state kept on the server."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from app.tasks.knowledge_trace.schemas import MAX_INTERACTIONS, Interaction, NextPrediction, QuestionKey

_EXAMPLE = {
    "model": "dkvmn-assist2009",
    "interactions": [{"question": 12, "correct": True}],
    "next_questions": [3, 7, 12],
}


class AppendRequest(BaseModel):
    """New interactions of one student, oldest first, appended to what the server already holds."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [_EXAMPLE]})

    model: str | None = Field(default=None, description="a knowledge-trace model from GET /models; null = default")
    interactions: list[Interaction] = Field(
        min_length=1, max_length=MAX_INTERACTIONS, description="the new interactions, oldest first"
    )
    next_questions: list[QuestionKey] | None = Field(
        default=None,
        max_length=MAX_INTERACTIONS,
        description="question ids to predict after the last new interaction; null or [] = none (the default)",
    )
    expected_interactions: StrictInt | None = Field(
        default=None,
        ge=0,
        description="the student's interaction count these extend (0: a new student); another stored count is a "
        "409 and nothing is stored, so a retried append is never counted twice. null = append to any count",
    )
    return_attention: StrictBool = Field(
        default=False,
        description="true: `attention` holds the correlation weights of each new interaction (always null for DKT)",
    )
    return_mastery_steps: StrictBool = Field(
        default=False,
        description="true: `mastery_steps` holds the mastery before and after each new interaction "
        "(always null for DKT)",
    )


class AppendResponse(BaseModel):
    model: str
    interactions: int = Field(description="interactions the student's state has seen, these included")
    predictions: list[float] = Field(
        description="for each new interaction, P(correct) predicted before seeing it (for calibration logs)"
    )
    mastery: list[float] | None = Field(
        description="n_concepts mastery values after the last new interaction; null for DKT (no memory slots)"
    )
    next: list[NextPrediction] = Field(description="predictions for `next_questions`, in the order asked")
    attention: list[list[float]] | None = Field(
        default=None, description="with return_attention: new interactions x n_concepts correlation weights; else null"
    )
    mastery_steps: list[list[float]] | None = Field(
        default=None,
        description="with return_mastery_steps: (new interactions + 1) x n_concepts, row 0 is the mastery of the "
        "stored state before them (the prior for a new student), then one row after each; else null",
    )


class StudentResponse(BaseModel):
    student_id: str
    model: str
    model_sha256: str = Field(description="sha256 of the model file the state was built with")
    interactions: int
    mastery: list[float] | None = Field(
        description="n_concepts mastery values after the last interaction; null for DKT (no memory slots)"
    )
    created_at: str = Field(description="ISO 8601, UTC")
    updated_at: str = Field(description="ISO 8601, UTC")


class DeletedState(BaseModel):
    model: str
    interactions: int


class DeleteResponse(BaseModel):
    student_id: str
    deleted: list[DeletedState] = Field(description="the states removed, one per model; [] if there were none")


class StudentList(BaseModel):
    student_ids: list[str] = Field(description="ascending code-point order")
    next_after: str | None = Field(description="pass as `after` for the next page; null on the last page")
