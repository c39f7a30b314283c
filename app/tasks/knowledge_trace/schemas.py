"""POST /knowledge-trace bodies, for DKVMN and the DKT baseline (for DKT, the concept fields are null)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, StrictBool, WithJsonSchema, with_config
from pydantic_core import PydanticCustomError
from typing_extensions import TypedDict  # pydantic needs it (not typing's) before Python 3.12

MAX_INTERACTIONS = 10_000
MAX_QUESTION_ID = 2**31 - 1  # ids are int64 in the graph; each model's own range (n_questions) is checked after
MAX_QUESTION_TEXT = 200  # characters of a string question id (a model trained on your own CSV may have them)
# A question as requests name it: the built-in models' ids are integers 1..n_questions; a model trained with
# `mnemo train kt` takes the CSV's own ids, integers or strings (GET /models/{name}/questions lists them).
QUESTION_KEY_SCHEMA = {
    "anyOf": [
        {"type": "integer", "minimum": 1, "maximum": MAX_QUESTION_ID},
        {"type": "string", "minLength": 1, "maxLength": MAX_QUESTION_TEXT},
    ]
}


def question_key(value: object) -> int | str:
    """An integer in 1..MAX_QUESTION_ID or a string of 1..MAX_QUESTION_TEXT characters, as is (no coercion).

    One validator, not a union of the two types: a union's errors carry each member's name in their location
    (`question.constrained-int`) and come in pairs, so a 422 would no longer name the field alone."""
    if type(value) is int:
        if value < 1:
            raise PydanticCustomError("greater_than_equal", "Input should be greater than or equal to 1")
        if value > MAX_QUESTION_ID:
            raise PydanticCustomError("less_than_equal", f"Input should be less than or equal to {MAX_QUESTION_ID}")
        return value
    if type(value) is str:
        if not 1 <= len(value) <= MAX_QUESTION_TEXT:
            raise PydanticCustomError("string_length", f"A string id should have 1 to {MAX_QUESTION_TEXT} characters")
        return value
    raise PydanticCustomError("question_type", "Input should be an integer or a string")


QuestionKey = Annotated[int | str, PlainValidator(question_key), WithJsonSchema(QUESTION_KEY_SCHEMA)]
QUESTION_HELP = "the question's id: 1..n_questions, or the model's own ids (GET /models/{name}/questions)"

_EXAMPLE = {
    "model": "dkvmn-assist2009",
    "interactions": [{"question": 12, "correct": True}, {"question": 12, "correct": False}],
    "next_questions": [3, 7],
    "return_attention": True,
}


@with_config(ConfigDict(extra="forbid"))
class Interaction(TypedDict):
    """One answered question; `question` is its id (1..n_questions, or the ids of a model trained on your own CSV).

    A TypedDict, not a model: no object per item, so long histories validate faster."""

    question: Annotated[QuestionKey, Field(description=QUESTION_HELP)]
    correct: StrictBool


class KnowledgeTraceRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [_EXAMPLE]})

    model: str | None = Field(default=None, description="a knowledge-trace model from GET /models; null = default")
    interactions: list[Interaction] = Field(min_length=1, max_length=MAX_INTERACTIONS, description="oldest first")
    next_questions: list[QuestionKey] | None = Field(
        default=None, max_length=MAX_INTERACTIONS, description="question ids to predict next; null = every question"
    )
    return_attention: StrictBool = Field(
        default=True, description="false: `attention` is null (always null for a DKT model: no memory slots)"
    )
    mastery: Literal["all", "last", "none"] = Field(
        default="all",
        description="mastery rows to return: all (the prior and one per interaction), last, none "
        "(always null for a DKT model: no memory slots)",
    )
    return_predictions: StrictBool = Field(default=True, description="false: `predictions` is null")


class NextPrediction(BaseModel):
    question: Annotated[int, Field(ge=1)] | str = Field(description=QUESTION_HELP)
    p_correct: float = Field(ge=0, le=1)
    concept: int | None = Field(
        description="the latent concept this question weighs most (argmax of its attention); null for DKT"
    )
    name: str | None = Field(default=None, description="the question's name where the data set has one")


class KnowledgeTraceResponse(BaseModel):
    model: str
    family: Literal["dkvmn", "dkt"] = Field(
        description="dkvmn: memory slots as latent concepts (mastery, attention, concepts); dkt: an LSTM without "
        "them, so mastery, attention, n_concepts and next[].concept are null"
    )
    n_concepts: int | None = Field(description="latent concepts (memory slots); null for DKT")
    predictions: list[Annotated[float, Field(ge=0, le=1)]] | None = Field(
        description="P(interaction t correct | interactions 0..t-1); null with return_predictions false"
    )
    next: list[NextPrediction]
    mastery: list[list[float]] | None = Field(
        description="mastery all: (len(interactions) + 1) x n_concepts, row 0 is the prior; last: the final row "
        "only (1 x n_concepts); none: null. Always null for DKT (no memory slots)"
    )
    attention: list[list[float]] | None = Field(
        description="len(interactions) x n_concepts correlation weights; null with return_attention false, and "
        "always for DKT (no memory slots)"
    )


class CatalogQuestion(BaseModel):
    question: Annotated[int, Field(ge=1)] | str = Field(description=QUESTION_HELP)
    name: str | None = Field(description="the question's name where the data set has one")
    concept: int | None = Field(description="the latent concept this question weighs most; null for DKT")


class ConceptLabel(BaseModel):
    concept: int
    label: str = Field(description="the top skill names, joined with ', '")
    top_skills: list[str] = Field(description="the skills with the largest correlation weight on it, strongest first")
    main_of: int = Field(description="how many questions have this concept as their main concept (0: weakly used)")


class QuestionCatalog(BaseModel):
    model: str
    total: int = Field(description="number of questions of the model")
    offset: int
    limit: int
    questions: list[CatalogQuestion]
    concepts: list[ConceptLabel] | None = Field(
        description="every concept's label where the data set names its questions by skill (assist2009), else null"
    )
