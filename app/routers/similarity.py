"""POST /similarity and /similarity/batch: LSTM_RMC relatedness, entailment and attention maps."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from app.errors import InvalidInput
from app.inference.similarity import ENTAILMENT_LABELS, EncodedSentence, PairResult, encode, score_pairs
from app.inference.word_vectors import WordVectors
from app.schemas.similarity import (
    Attention,
    Entailment,
    SimilarityBatchRequest,
    SimilarityBatchResponse,
    SimilarityRequest,
    SimilarityResponse,
)

TASK = "similarity"
GRAPH_BATCH = 64  # pairs per ONNX call in /similarity/batch
router = APIRouter(tags=["similarity"])


def prepare(model, settings) -> None:
    """Attach the word vectors (GloVe shared across models, special tokens from the model's asset)."""
    model.state["vectors"] = WordVectors.from_glove(model.assets["special_vectors"])


def _encode_checked(model, text: str, location: tuple) -> EncodedSentence:
    """Tokenize and embed; more tokens than the model accepts is a 422 naming the sentence and the limit."""
    sentence = encode(text, model.state["vectors"])
    limit = int(model.limits["max_tokens"])
    if len(sentence.tokens) > limit:
        raise InvalidInput(
            location,
            f"{location[-1]} has {len(sentence.tokens)} tokens; model {model.name} accepts at most {limit} "
            "(including the <s> and </s> markers)",
        )
    return sentence


def _response(model_name: str, result: PairResult) -> SimilarityResponse:
    unknown = list(dict.fromkeys(result.sentence_a.unknown + result.sentence_b.unknown))
    probabilities = {label: float(p) for label, p in zip(ENTAILMENT_LABELS, result.entailment, strict=True)}
    attention = None
    if result.attention_a is not None and result.attention_b is not None:
        attention = Attention(sentence_a=result.attention_a.tolist(), sentence_b=result.attention_b.tolist())
    return SimilarityResponse(
        model=model_name,
        relatedness=result.relatedness,
        similarity=(result.relatedness - 1) / 4,
        entailment=Entailment(label=max(probabilities, key=probabilities.get), probabilities=probabilities),
        tokens_a=result.sentence_a.tokens,
        tokens_b=result.sentence_b.tokens,
        unknown_tokens=unknown,
        attention=attention,
    )


def _score(model, pairs: list[tuple[EncodedSentence, EncodedSentence]], return_attention: bool) -> list[PairResult]:
    pointer, window = model.metadata["pointer"], int(model.metadata["window"])
    results: list[PairResult] = []
    for start in range(0, len(pairs), GRAPH_BATCH):
        results += score_pairs(model.run, pairs[start : start + GRAPH_BATCH], pointer, window, return_attention)
    return results


@router.post("/similarity", response_model=SimilarityResponse, response_model_exclude_none=False)
async def similarity(body: SimilarityRequest, request: Request) -> SimilarityResponse:
    """Relatedness (1..5), entailment probabilities and per-sentence attention maps of one pair."""
    model = request.app.state.registry.get(body.model, TASK)
    pair = (
        _encode_checked(model, body.sentence_a, ("body", "sentence_a")),
        _encode_checked(model, body.sentence_b, ("body", "sentence_b")),
    )
    results = await run_in_threadpool(_score, model, [pair], body.return_attention)
    return _response(model.name, results[0])


@router.post("/similarity/batch", response_model=SimilarityBatchResponse)
async def similarity_batch(body: SimilarityBatchRequest, request: Request) -> SimilarityBatchResponse:
    """Up to 256 pairs in one call; results in request order."""
    model = request.app.state.registry.get(body.model, TASK)
    pairs = await run_in_threadpool(_encode_batch, model, body)
    results = await run_in_threadpool(_score, model, pairs, body.return_attention)
    return SimilarityBatchResponse(model=model.name, results=[_response(model.name, r) for r in results])


def _encode_batch(model, body: SimilarityBatchRequest) -> list[tuple[EncodedSentence, EncodedSentence]]:
    return [
        (
            _encode_checked(model, pair.sentence_a, ("body", "pairs", index, "sentence_a")),
            _encode_checked(model, pair.sentence_b, ("body", "pairs", index, "sentence_b")),
        )
        for index, pair in enumerate(body.pairs)
    ]
