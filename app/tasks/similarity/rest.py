"""The similarity task's JSON API: POST /similarity, /similarity/batch, /embeddings, /similarity/from-embeddings."""

from __future__ import annotations

from app.core.responses import dumps
from app.runtime.model import Endpoint, ServedModel
from app.runtime.offload import offload, offload_if
from app.tasks.similarity import schemas, service

INLINE_RENDER_CELLS = 2048  # answers with fewer numbers (attention cells, vector entries) are rendered on the loop


async def _pairs_answer(
    model: ServedModel, body: schemas.SimilarityRequest | schemas.SimilarityBatchRequest, alone: bool
) -> bytes:
    """The JSON of POST /similarity or /similarity/batch; tokenized on a worker thread unless one pair comes alone."""
    batch, return_attention = isinstance(body, schemas.SimilarityBatchRequest), body.return_attention
    texts = [(pair.sentence_a, pair.sentence_b) for pair in (body.pairs if batch else [body])]
    locations = [("body", "pairs", index) for index in range(len(texts))] if batch else [("body",)]
    pairs = await offload_if(batch or not alone, service.encode_pairs, model, texts, locations)
    outputs = await service.run_pairs(model, pairs)

    def render() -> bytes:
        # One short orjson call per pair: a worker thread never holds the GIL for a whole large answer.
        results = [
            dumps(service.decode(model, pair, out, return_attention)) for pair, out in zip(pairs, outputs, strict=True)
        ]
        return b'{"model":%s,"results":[%s]}' % (dumps(model.name), b",".join(results)) if batch else results[0]

    longest = max([len(sentence.tokens) for pair in pairs for sentence in pair]) if return_attention else 0
    cells = len(pairs) * (1 + longest**2)
    return await offload_if(cells > INLINE_RENDER_CELLS, render)


async def _embeddings_answer(model: ServedModel, body: schemas.EmbeddingsRequest, alone: bool) -> bytes:
    limits, count = model.state.embeddings, len(body.sentences)
    located = [(text, ("body", "sentences", index)) for index, text in enumerate(body.sentences)]
    counted = f"sentences has {count} items"
    sentences = await offload(service.encode_each, model, located, counted, limits["max_sentences"], count, "sentences")
    vectors = await service.embed(model, sentences)

    def render() -> bytes:
        results = [
            {"embedding": vector, "tokens": sentence.tokens, "unknown_tokens": list(dict.fromkeys(sentence.unknown))}
            for sentence, vector in zip(sentences, vectors, strict=True)
        ]
        head = {"model": model.name, "encoder": limits["encoder"], "embedding_dim": limits["embedding_dim"]}
        return dumps(head | {"results": results})

    return await offload_if(len(sentences) * limits["embedding_dim"] > INLINE_RENDER_CELLS, render)


async def _vector_pair_answer(model: ServedModel, body: schemas.EmbeddingPairRequest, alone: bool) -> bytes:
    outputs = await service.graph_of(model, "head").batcher.run(service.vector_pair(model, body), 1, 1)
    return dumps(service.scores(model, outputs))


ENDPOINTS = (
    Endpoint(
        path="/similarity",
        operation_id="similarity",
        request=schemas.SimilarityRequest,
        response=schemas.SimilarityResponse,
        description="Relatedness (1..5), entailment probabilities and per-sentence attention maps of one pair.",
        admit=lambda model, body: model.batcher.admit(1),
        answer=_pairs_answer,
    ),
    Endpoint(
        path="/similarity/batch",
        operation_id="similarity_batch",
        request=schemas.SimilarityBatchRequest,
        response=schemas.SimilarityBatchResponse,
        description="Up to 256 pairs in one call; results in request order, each as from POST /similarity.",
        admit=lambda model, body: model.batcher.admit(len(body.pairs)),
        answer=_pairs_answer,
    ),
    Endpoint(
        path="/embeddings",
        operation_id="embeddings",
        request=schemas.EmbeddingsRequest,
        response=schemas.EmbeddingsResponse,
        description="Up to 256 sentences: each one's sentence vector (the final memory of the forward pass, then "
        "of the backward pass: what the pair heads read) and its tokens. Score two stored vectors with "
        "POST /similarity/from-embeddings.",
        admit=lambda model, body: service.graph_of(model, "encoder").batcher.admit(len(body.sentences)),
        answer=_embeddings_answer,
        reserve=False,
    ),
    Endpoint(
        path="/similarity/from-embeddings",
        operation_id="similarity_from_embeddings",
        request=schemas.EmbeddingPairRequest,
        response=schemas.EmbeddingPairResponse,
        description="Relatedness and entailment of two stored sentence vectors from POST /embeddings of the same "
        "model: only the pair heads run, with the same result as POST /similarity on the two sentences.",
        admit=lambda model, body: service.graph_of(model, "head").batcher.admit(1),
        answer=_vector_pair_answer,
        reserve=False,
    ),
)
