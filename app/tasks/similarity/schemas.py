"""POST /similarity, /similarity/batch, /embeddings and /similarity/from-embeddings bodies."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, WithJsonSchema, create_model

from app.tasks.similarity.tokenizer import CONTROL_CHARACTERS

MAX_CHARACTERS = 1000
MAX_BATCH_PAIRS = 256
MAX_SENTENCES = 256  # per POST /embeddings; a model's own limit (GET /models: max_sentences) may be lower
MAX_VECTOR_VALUES = 4096  # any model's sentence vector fits; the model's own size is checked by the service
MAX_VECTOR_MAGNITUDE = 1e6  # far above what the encoder produces, far below where float32 overflows
MAX_ENCODER_ID_CHARACTERS = 64  # an `encoder` from POST /embeddings is 16; room for a longer form later
EXAMPLE_VECTOR_VALUES = 768  # the default model's embedding_dim (tests/api/test_api.py posts every example)
ENTAILMENT_LABELS = ("ENTAILMENT", "NEUTRAL", "CONTRADICTION")  # as the SICK-trained models list them
PARAPHRASE_LABELS = ("NOT_PARAPHRASE", "PARAPHRASE")  # the label of a logit below 0, of a logit from 0 up
ASCII_PUNCTUATION = r"!-/:-@\[-`{-~"
# What service.encode_sentence checks: no control character, and one that is neither whitespace nor punctuation
SENTENCE_PATTERN = rf"^[^{CONTROL_CHARACTERS}]*[^\s{ASCII_PUNCTUATION}{CONTROL_CHARACTERS}][^{CONTROL_CHARACTERS}]*$"
Sentence = Annotated[
    str,
    StringConstraints(strict=True, min_length=1, max_length=MAX_CHARACTERS),
    WithJsonSchema({"type": "string", "minLength": 1, "maxLength": MAX_CHARACTERS, "pattern": SENTENCE_PATTERN}),
]

_PAIR = {"sentence_a": "A man is playing a guitar.", "sentence_b": "A person plays an instrument."}


def _strict(example: dict) -> ConfigDict:
    """A request body's config: unknown fields refused, `example` shown in the OpenAPI document."""
    return ConfigDict(extra="forbid", json_schema_extra={"examples": [example]})


class SentencePair(BaseModel):
    model_config = _strict(_PAIR)

    sentence_a: Sentence
    sentence_b: Sentence


class SimilarityRequest(SentencePair):
    model_config = _strict({**_PAIR, "model": None, "return_attention": True})

    model: str | None = Field(default=None, description="a similarity model from GET /models; null = default")
    return_attention: bool = Field(True, strict=True)


class SimilarityBatchRequest(BaseModel):
    model_config = _strict({"pairs": [_PAIR], "model": None, "return_attention": False})

    pairs: list[SentencePair] = Field(min_length=1, max_length=MAX_BATCH_PAIRS)
    model: str | None = None
    return_attention: bool = Field(False, strict=True)


Probability = Annotated[float, Field(ge=0, le=1)]
EntailmentLabel = StrEnum("EntailmentLabel", {label: label for label in ENTAILMENT_LABELS})
EntailmentProbabilities = create_model("EntailmentProbabilities", **dict.fromkeys(ENTAILMENT_LABELS, Probability))
ParaphraseLabel = StrEnum("ParaphraseLabel", {label: label for label in PARAPHRASE_LABELS})


class Entailment(BaseModel):
    label: EntailmentLabel = Field(description="the most probable label")
    probabilities: EntailmentProbabilities


class Paraphrase(BaseModel):
    label: ParaphraseLabel = Field(description="PARAPHRASE when probability is 0.5 or more")
    probability: Probability = Field(description="the probability that the two sentences are paraphrases")


class Attention(BaseModel):
    sentence_a: list[list[float]] = Field(description="len(tokens_a) x len(tokens_a); see the model card")
    sentence_b: list[list[float]]


class EmbeddingPairResponse(BaseModel):
    model: str
    relatedness: float = Field(ge=1, le=5, description="SICK relatedness, 1..5")
    similarity: float = Field(ge=0, le=1, description="(relatedness - 1) / 4, in 0..1")
    entailment: Entailment | None = Field(
        default=None,
        description="absent when the model was trained without entailment labels (GET /models: entailment_labels [])",
    )


class SimilarityResponse(EmbeddingPairResponse):  # the scores of two stored vectors, and what the text gave
    paraphrase: Paraphrase | None = Field(
        default=None,
        description="only from a model with a paraphrase head (GET /models: paraphrase_labels; metadata.dataset "
        "msrp); absent from the others' answers",
    )
    tokens_a: list[str] = Field(description="tokens the model read, with the <s> and </s> markers")
    tokens_b: list[str]
    unknown_tokens: list[str] = Field(description="tokens without a word vector (read as <unk>)")
    attention: Attention | None = None


class SimilarityBatchResponse(BaseModel):
    model: str
    results: list[SimilarityResponse]


class EmbeddingsRequest(BaseModel):
    model_config = _strict({"sentences": list(_PAIR.values()), "model": None})

    sentences: list[Sentence] = Field(min_length=1, max_length=MAX_SENTENCES)
    model: str | None = Field(default=None, description="a similarity model from GET /models; null = default")


class SentenceEmbedding(BaseModel):
    embedding: list[float] = Field(description="the sentence vector (embedding_dim floats)")
    tokens: list[str] = Field(description="tokens the model read, with the <s> and </s> markers")
    unknown_tokens: list[str] = Field(description="tokens without a word vector (read as <unk>)")


class EmbeddingsResponse(BaseModel):
    model: str
    encoder: str = Field(
        description="identifies the encoder (weights and word vectors) that made the vectors; store it with them and "
        "send it as encoder_a/encoder_b to POST /similarity/from-embeddings"
    )
    embedding_dim: int
    results: list[SentenceEmbedding] = Field(description="one per sentence, in request order")


Vector = Annotated[
    list[Annotated[float, Field(strict=True, allow_inf_nan=False, ge=-MAX_VECTOR_MAGNITUDE, le=MAX_VECTOR_MAGNITUDE)]],
    Field(min_length=1, max_length=MAX_VECTOR_VALUES, description="a sentence vector from POST /embeddings"),
]
EncoderId = Annotated[str, StringConstraints(strict=True, min_length=1, max_length=MAX_ENCODER_ID_CHARACTERS)]


class EmbeddingPairRequest(BaseModel):
    model_config = _strict(
        {"embedding_a": [0.1] * EXAMPLE_VECTOR_VALUES, "embedding_b": [0.2] * EXAMPLE_VECTOR_VALUES}
        | {"encoder_a": None, "encoder_b": None, "model": None}
    )

    embedding_a: Vector
    embedding_b: Vector
    encoder_a: EncoderId | None = Field(
        default=None,
        description="the `encoder` of the POST /embeddings answer that made embedding_a; a 422 when it is not the "
        "model's (GET /models: encoder). null: not checked",
    )
    encoder_b: EncoderId | None = Field(default=None, description="likewise for embedding_b")
    model: str | None = Field(default=None, description="the similarity model whose /embeddings made both vectors")
