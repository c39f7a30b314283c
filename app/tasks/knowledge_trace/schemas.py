"""POST /knowledge-trace and /students bodies, for DKVMN and the DKT baseline (for DKT, the concept fields are null)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, GetPydanticSchema, StrictBool, StrictInt, with_config
from pydantic_core import core_schema
from typing_extensions import TypedDict  # pydantic needs it (not typing's) before Python 3.12

MAX_INTERACTIONS = 10_000
MAX_QUESTION_ID = 2**31 - 1  # ids are int64 in the graph; each model's own range (n_questions) is checked after
MAX_QUESTION_TEXT = 200  # characters of a string question id (a model trained on your own CSV may have them)
# the built-in models' questions are 1..n_questions; a model of `mnemo train kt` takes the CSV's ids, int or str.
# One union schema with its own error: one 422 per bad id, at the id (a plain union gives one per member, deeper).
QuestionKey = Annotated[
    int | str,
    GetPydanticSchema(
        lambda _type, _handler: core_schema.union_schema(
            [
                core_schema.int_schema(ge=1, le=MAX_QUESTION_ID, strict=True),
                core_schema.str_schema(min_length=1, max_length=MAX_QUESTION_TEXT, strict=True),
            ],
            custom_error_type="question_id",
            custom_error_message=f"Input should be an integer in 1..{MAX_QUESTION_ID} "
            f"or a string of 1 to {MAX_QUESTION_TEXT} characters",
        )
    ),
]
QUESTION_HELP = "the question's id: 1..n_questions, or the model's own ids (GET /models/{name}/questions)"
Question = Annotated[QuestionKey, Field(description=QUESTION_HELP)]
ModelName = Annotated[str | None, Field(description="a knowledge-trace model from GET /models; null = default")]
TWO_ANSWERS = [{"question": 12, "correct": True}, {"question": 12, "correct": False}]
EXAMPLE = {"model": "dkvmn-assist2009", "interactions": TWO_ANSWERS, "next_questions": [3, 7], "return_attention": True}
APPEND_EXAMPLE = {"model": "dkvmn-assist2009", "interactions": TWO_ANSWERS[:1], "next_questions": [3, 7, 12]}


@with_config(ConfigDict(extra="forbid"))
class Interaction(TypedDict):  # not a model: no object per item, so long histories validate faster
    """One answered question; `question` is its id (1..n_questions, or the ids of a model trained on your own CSV)."""

    question: Question
    correct: StrictBool


Interactions = Annotated[list[Interaction], Field(min_length=1, max_length=MAX_INTERACTIONS)]
NextQuestions = Annotated[list[QuestionKey] | None, Field(max_length=MAX_INTERACTIONS)]


class KnowledgeTraceRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [EXAMPLE]})

    model: ModelName = None
    interactions: Interactions = Field(description="oldest first")
    next_questions: NextQuestions = Field(None, description="question ids to predict next; null = every question")
    return_attention: StrictBool = Field(
        True, description="false: `attention` is null (always null for a DKT model: no memory slots)"
    )
    mastery: Literal["all", "last", "none"] = Field(
        "all",
        description="mastery rows to return: all (the prior and one per interaction), last, none "
        "(always null for a DKT model: no memory slots)",
    )
    return_predictions: StrictBool = Field(True, description="false: `predictions` is null")


class CatalogQuestion(BaseModel):
    question: Question
    concept: int | None = Field(
        description="the latent concept this question weighs most (argmax of its attention); null for DKT"
    )
    name: str | None = Field(description="the question's name where the data set has one")


class NextPrediction(CatalogQuestion):
    p_correct: float = Field(ge=0, le=1)


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


class AppendRequest(BaseModel):
    """New interactions of one student, oldest first, appended to what the server already holds."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [APPEND_EXAMPLE]})

    model: ModelName = None
    interactions: Interactions = Field(description="the new interactions, oldest first")
    next_questions: NextQuestions = Field(
        None, description="question ids to predict after the last new interaction; null or [] = none (the default)"
    )
    expected_interactions: StrictInt | None = Field(
        None,
        ge=0,
        description="the student's interaction count these extend (0: a new student); another stored count is a "
        "409 and nothing is stored, so a retried append is never counted twice. null = append to any count",
    )
    return_attention: StrictBool = Field(
        False,
        description="true: `attention` holds the correlation weights of each new interaction (always null for DKT)",
    )
    return_mastery_steps: StrictBool = Field(
        False,
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
        None, description="with return_attention: new interactions x n_concepts correlation weights; else null"
    )
    mastery_steps: list[list[float]] | None = Field(
        None,
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
    interactions: int | None = Field(description="null: its stored count was unreadable (not written by mnemo)")


class DeleteResponse(BaseModel):
    student_id: str
    deleted: list[DeletedState] = Field(description="the states removed, one per model; [] if there were none")


class StudentList(BaseModel):
    student_ids: list[str] = Field(description="ascending code-point order")
    next_after: str | None = Field(description="pass as `after` for the next page; null on the last page")
