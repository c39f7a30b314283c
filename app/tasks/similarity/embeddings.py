"""Sentence vectors of the LSTM_RMC encoder (`encoder` graph), and pair scores from two stored vectors
(`head` graph, the same outputs as the pair graph); transport-free."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import numpy as np

from app.core.errors import InvalidInput, UnknownModel, each_checked
from app.runtime.collate import Feeds
from app.runtime.model import ServedModel
from app.tasks.similarity.service import EmbeddingLimits, EncodedSentence, SimilarityState, encode_sentence


def limits_of(model: ServedModel) -> EmbeddingLimits:
    """The model's embedding limits; 404 when its manifest entry has no encoder and head graphs."""
    state: SimilarityState = model.state
    if state.embeddings is None:
        raise UnknownModel(f"Model {model.name} has no sentence encoder graph, so it serves no embeddings.")
    return state.embeddings


def graph_of(model: ServedModel, key: str) -> ServedModel:
    """The model's `encoder` or `head` graph; 404 when it has none."""
    limits_of(model)
    return model.graphs[key]


def encode_sentences(model: ServedModel, texts: Sequence[str]) -> list[EncodedSentence]:
    """Tokenize and embed each sentence of `body.sentences`; over a limit is a 422 naming the field."""
    limits = limits_of(model)
    if len(texts) > limits.max_sentences:
        raise InvalidInput(
            ("body", "sentences"),
            f"sentences has {len(texts)} items; model {model.name} accepts at most {limits.max_sentences} per request",
        )
    return each_checked(
        partial(encode_sentence, model, text, ("body", "sentences", index)) for index, text in enumerate(texts)
    )


async def embed(model: ServedModel, sentences: Sequence[EncodedSentence]) -> list[np.ndarray]:
    """The sentence vector of each sentence; each is one row in the encoder's batches (with other requests')."""
    batcher = graph_of(model, "encoder").batcher
    feeds = [
        {"emb": sentence.vectors[np.newaxis], "len": np.array([len(sentence.tokens)], dtype=np.int64)}
        for sentence in sentences
    ]
    outputs = await batcher.run_all([(feed, 1, len(s.tokens)) for feed, s in zip(feeds, sentences, strict=True)])
    return [output["embedding"][0] for output in outputs]


def vector_pair(
    model: ServedModel,
    embedding_a: Sequence[float],
    embedding_b: Sequence[float],
    encoders: tuple[str | None, str | None] = (None, None),
) -> Feeds:
    """Head feeds for two stored vectors; whose `encoder_a`/`encoder_b` (when given) is not this model's, or of the
    wrong size, is a 422 naming the field (all such fields)."""
    limits = limits_of(model)

    def check_encoder(field: str, encoder: str | None) -> None:
        if encoder is not None and encoder != limits.encoder:
            raise InvalidInput(
                ("body", field),
                f"{field} is not {limits.encoder!r}, the encoder of model {model.name}: the vector was made by another "
                "model or another version of it, and this model's head would score it as noise; embed the sentence "
                f"again with POST /embeddings and model {model.name}",
            )

    def vector(field: str, values: Sequence[float]) -> np.ndarray:
        if len(values) != limits.dimension:
            raise InvalidInput(
                ("body", field),
                f"{field} has {len(values)} values; model {model.name} takes sentence vectors of {limits.dimension} "
                "(from POST /embeddings with the same model)",
            )
        return np.asarray(values, dtype=np.float32)[np.newaxis]

    _, _, first, second = each_checked(
        [
            partial(check_encoder, "encoder_a", encoders[0]),
            partial(check_encoder, "encoder_b", encoders[1]),
            partial(vector, "embedding_a", embedding_a),
            partial(vector, "embedding_b", embedding_b),
        ]
    )
    return {"embedding_a": first, "embedding_b": second}


async def score_vectors(model: ServedModel, feeds: Feeds) -> Feeds:
    """The head graph's outputs for one pair of vectors, batched with other requests' pairs."""
    return await graph_of(model, "head").batcher.run(feeds, 1, 1)
