"""The similarity task's JSON API: POST /similarity, /similarity/batch, /embeddings, /similarity/from-embeddings.

Each endpoint says how its request is admitted and how its answer is computed and rendered; the REST
transport (app/transports/rest.py) does the rest.
"""

from __future__ import annotations

from collections.abc import Awaitable

from app.core.responses import dumps
from app.runtime.model import Admission, Endpoint, ServedModel
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


def _pair_answer(model: ServedModel, body: SimilarityRequest, alone: bool) -> Awaitable[bytes]:
    pair = [(body.sentence_a, body.sentence_b)]
    return _answer(model, pair, [("body",)], body.return_attention, batch=False, encode_inline=alone)


def _batch_answer(model: ServedModel, body: SimilarityBatchRequest, alone: bool) -> Awaitable[bytes]:
    texts = [(pair.sentence_a, pair.sentence_b) for pair in body.pairs]
    locations = [("body", "pairs", index) for index in range(len(texts))]
    return _answer(model, texts, locations, body.return_attention, batch=True)


async def _embeddings_answer(model: ServedModel, body: EmbeddingsRequest, alone: bool) -> bytes:
    sentences = await offload(embeddings.encode_sentences, model, body.sentences)
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


async def _vector_pair_answer(model: ServedModel, body: EmbeddingPairRequest, alone: bool) -> bytes:
    feeds = embeddings.vector_pair(model, body.embedding_a, body.embedding_b, (body.encoder_a, body.encoder_b))
    return dumps(service.scores(model, await embeddings.score_vectors(model, feeds)))


ENDPOINTS = (
    Endpoint(
        path="/similarity",
        name="similarity",
        operation_id="similarity",
        request=SimilarityRequest,
        response=SimilarityResponse,
        description="Relatedness (1..5), entailment probabilities and per-sentence attention maps of one pair.",
        admit=lambda model, body: Admission(model.batcher, 1),
        answer=_pair_answer,
    ),
    Endpoint(
        path="/similarity/batch",
        name="similarity_batch",
        operation_id="similarity_batch",
        request=SimilarityBatchRequest,
        response=SimilarityBatchResponse,
        description="Up to 256 pairs in one call; results in request order, each as from POST /similarity.",
        admit=lambda model, body: Admission(model.batcher, len(body.pairs)),
        answer=_batch_answer,
    ),
    Endpoint(
        path="/embeddings",
        name="sentence_embeddings",
        operation_id="embeddings",
        request=EmbeddingsRequest,
        response=EmbeddingsResponse,
        description="Up to 256 sentences: each one's sentence vector (the final memory of the forward pass, then "
        "of the backward pass: what the pair heads read) and its tokens. Score two stored vectors with "
        "POST /similarity/from-embeddings.",
        admit=lambda model, body: Admission(embeddings.graph_of(model, "encoder").batcher, len(body.sentences)),
        answer=_embeddings_answer,
        reserve=False,
    ),
    Endpoint(
        path="/similarity/from-embeddings",
        name="similarity_from_embeddings",
        operation_id="similarity_from_embeddings",
        request=EmbeddingPairRequest,
        response=EmbeddingPairResponse,
        description="Relatedness and entailment of two stored sentence vectors from POST /embeddings of the same "
        "model: only the pair heads run, with the same result as POST /similarity on the two sentences.",
        admit=lambda model, body: Admission(embeddings.graph_of(model, "head").batcher, 1),
        answer=_vector_pair_answer,
        reserve=False,
    ),
)
