"""POST /similarity and /similarity/batch bodies."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StringConstraints

MAX_CHARACTERS = 1000
MAX_BATCH_PAIRS = 256


def _not_blank(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be empty or only whitespace")
    return text


Sentence = Annotated[
    str, StringConstraints(strict=True, min_length=1, max_length=MAX_CHARACTERS), AfterValidator(_not_blank)
]

_PAIR = {"sentence_a": "A man is playing a guitar.", "sentence_b": "A person plays an instrument."}


class SentencePair(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [_PAIR]})

    sentence_a: Sentence
    sentence_b: Sentence


class SimilarityRequest(SentencePair):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{**_PAIR, "model": None, "return_attention": True}]}
    )

    model: str | None = Field(default=None, description="a similarity model from GET /models; null = default")
    return_attention: StrictBool = True


class SimilarityBatchRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"pairs": [_PAIR], "model": None, "return_attention": False}]},
    )

    pairs: list[SentencePair] = Field(min_length=1, max_length=MAX_BATCH_PAIRS)
    model: str | None = None
    return_attention: StrictBool = False


class Entailment(BaseModel):
    label: str
    probabilities: dict[str, float]


class Attention(BaseModel):
    sentence_a: list[list[float]] = Field(description="len(tokens_a) x len(tokens_a); see the model card")
    sentence_b: list[list[float]]


class SimilarityResponse(BaseModel):
    model: str
    relatedness: float = Field(description="SICK relatedness, 1..5")
    similarity: float = Field(description="(relatedness - 1) / 4, in 0..1")
    entailment: Entailment
    tokens_a: list[str] = Field(description="tokens the model read, with the <s> and </s> markers")
    tokens_b: list[str]
    unknown_tokens: list[str] = Field(description="tokens without a word vector (read as <unk>)")
    attention: Attention | None = None


class SimilarityBatchResponse(BaseModel):
    model: str
    results: list[SimilarityResponse]
