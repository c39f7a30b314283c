"""POST /similarity, /similarity/batch, /embeddings, /similarity/from-embeddings: the thin HTTP adapter."""

from __future__ import annotations

from fastapi import APIRouter, Request

from app.core.responses import JsonResponse, dumps
from app.runtime.model import ServedModel
from app.runtime.offload import offload, offload_if
from app.tasks.similarity import embeddings, service
from app.tasks.similarity.schemas import (
    EmbeddingPairRequest,
    EmbeddingPairResponse,
    EmbeddingsRequest,
    EmbeddingsResponse,
    SimilarityBatchRequest,
    SimilarityBatchResponse,
    SimilarityRequest,
    SimilarityResponse,
)
from app.transports.http import alone, complete, json_body, read_body, registry

TASK_NAME = "similarity"
router = APIRouter(tags=["similarity"])
INLINE_RENDER_CELLS = 2048  # answers with fewer numbers (attention cells, vector entries) are rendered on the loop


async def _answer(
    model: ServedModel,
    texts: list[tuple[str, str]],
    locations: list[tuple],
    return_attention: bool,
    batch: bool,
    encode_inline: bool = False,
) -> bytes:
    """The answer's JSON; the pairs are tokenized on a worker thread unless `encode_inline`."""
    pairs = await offload_if(not encode_inline, service.encode_pairs, model, texts, locations)
    outputs = await service.run_pairs(model, pairs)

    def render() -> bytes:
        # One short orjson call per pair: a worker thread never holds the GIL for a whole large answer.
        results = [
            dumps(service.decode(model, pair, out, return_attention)) for pair, out in zip(pairs, outputs, strict=True)
        ]
        return b'{"model":%s,"results":[%s]}' % (dumps(model.name), b",".join(results)) if batch else results[0]

    cells = len(pairs) * (1 + return_attention * max(pair.length for pair in pairs) ** 2)
    return await offload_if(cells > INLINE_RENDER_CELLS, render)


@router.post(
    "/similarity",
    response_model=SimilarityResponse,
    openapi_extra=json_body(SimilarityRequest),
    operation_id="similarity",
)
async def similarity(request: Request) -> JsonResponse:
    """Relatedness (1..5), entailment probabilities and per-sentence attention maps of one pair."""
    body = await read_body(request, SimilarityRequest, TASK_NAME)
    model = registry(request).get(body.model, TASK_NAME)
    with model.batcher.admit(1):
        pair = [(body.sentence_a, body.sentence_b)]
        work = _answer(model, pair, [("body",)], body.return_attention, batch=False, encode_inline=alone(request))
        return JsonResponse(await complete(request, work, model.name))


@router.post(
    "/similarity/batch",
    response_model=SimilarityBatchResponse,
    openapi_extra=json_body(SimilarityBatchRequest),
    operation_id="similarity_batch",
)
async def similarity_batch(request: Request) -> JsonResponse:
    """Up to 256 pairs in one call; results in request order, each as from POST /similarity."""
    body = await read_body(request, SimilarityBatchRequest, TASK_NAME)
    model = registry(request).get(body.model, TASK_NAME)
    texts = [(pair.sentence_a, pair.sentence_b) for pair in body.pairs]
    locations = [("body", "pairs", index) for index in range(len(texts))]
    with model.batcher.admit(len(texts)):
        work = _answer(model, texts, locations, body.return_attention, batch=True)
        return JsonResponse(await complete(request, work, model.name))


async def _embeddings_answer(model: ServedModel, texts: list[str]) -> bytes:
    sentences = await offload(embeddings.encode_sentences, model, texts)
    vectors = await embeddings.embed(model, sentences)
    limits = embeddings.limits_of(model)

    def render() -> bytes:
        results = [
            {"embedding": vector, "tokens": sentence.tokens, "unknown_tokens": list(dict.fromkeys(sentence.unknown))}
            for sentence, vector in zip(sentences, vectors, strict=True)
        ]
        return dumps(
            {"model": model.name, "encoder": limits.encoder, "embedding_dim": limits.dimension, "results": results}
        )

    return await offload_if(len(sentences) * limits.dimension > INLINE_RENDER_CELLS, render)


@router.post(
    "/embeddings",
    response_model=EmbeddingsResponse,
    openapi_extra=json_body(EmbeddingsRequest),
    operation_id="embeddings",
)
async def sentence_embeddings(request: Request) -> JsonResponse:
    """Up to 256 sentences: each one's sentence vector (the final memory of the forward pass, then of the
    backward pass: what the pair heads read) and its tokens. Score two stored vectors with
    POST /similarity/from-embeddings."""
    body = await read_body(request, EmbeddingsRequest)
    model = registry(request).get(body.model, TASK_NAME)
    with embeddings.graph_of(model, "encoder").batcher.admit(len(body.sentences)):
        return JsonResponse(await complete(request, _embeddings_answer(model, body.sentences), model.name))


async def _vector_pair_answer(model: ServedModel, body: EmbeddingPairRequest) -> bytes:
    feeds = embeddings.vector_pair(model, body.embedding_a, body.embedding_b, (body.encoder_a, body.encoder_b))
    return dumps(service.scores(model, await embeddings.score_vectors(model, feeds)))


@router.post(
    "/similarity/from-embeddings",
    response_model=EmbeddingPairResponse,
    openapi_extra=json_body(EmbeddingPairRequest),
    operation_id="similarity_from_embeddings",
)
async def similarity_from_embeddings(request: Request) -> JsonResponse:
    """Relatedness and entailment of two stored sentence vectors from POST /embeddings of the same model:
    only the pair heads run, with the same result as POST /similarity on the two sentences."""
    body = await read_body(request, EmbeddingPairRequest)
    model = registry(request).get(body.model, TASK_NAME)
    with embeddings.graph_of(model, "head").batcher.admit(1):
        return JsonResponse(await complete(request, _vector_pair_answer(model, body), model.name))
