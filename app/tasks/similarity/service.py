"""The similarity service, transport-free: encode, run through the batcher, decode (pair, `encoder`, `head` graphs)."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any

import numpy as np

from app.core.errors import InvalidInput, UnknownModel, each_checked
from app.core.manifest import positive_int
from app.runtime.collate import Feeds, pad_rows
from app.runtime.model import ServedModel
from app.tasks.similarity.schemas import PARAPHRASE_LABELS, EmbeddingPairRequest
from app.tasks.similarity.tokenizer import CONTROL_CHARACTER, tokenize
from app.tasks.similarity.vectors import WordVectors

Location = tuple[str | int, ...]
PARAPHRASE_OUTPUT = "paraphrase_logits"


@dataclass(frozen=True)
class SimilarityState:
    """What requests need from one similarity model, checked at startup."""

    vectors: WordVectors
    max_tokens: int
    max_characters: int
    max_batch_pairs: int
    labels: tuple[str, ...]  # empty for a model trained without entailment labels: its answers omit entailment
    embeddings: dict[str, Any]  # GET /models: embedding_dim, max_sentences, encoder; {} without encoder and head
    paraphrase: bool  # its graph outputs PARAPHRASE_OUTPUT: its answers carry `paraphrase`


@dataclass(frozen=True)
class EncodedSentence:
    tokens: list[str]
    vectors: np.ndarray  # [len(tokens), 50]
    unknown: list[str]


EncodedPair = tuple[EncodedSentence, EncodedSentence]  # one row of the pair graph


def prepare(model: ServedModel) -> SimilarityState:
    """Limits and labels from the manifest; the GloVe vectors with the model's special-token vectors."""
    limits, metadata = model.entry.limits, model.entry.metadata
    labels = metadata.get("entailment_labels", [])  # none (relatedness only), or the keys of each answer's entailment
    names = labels if isinstance(labels, list) else [labels]
    named = {name for name in names if isinstance(name, str) and name.isprintable() and name.strip()}
    if names and not len(names) == len(named) == 3:
        raise ValueError("metadata.entailment_labels must list 3 distinct printable labels (none: relatedness only)")
    pointer, window = metadata.get("pointer"), positive_int(metadata, "window")
    if pointer not in ("vlmp", "flmp"):
        raise ValueError(f"metadata.pointer must be vlmp or flmp, not {pointer!r}")
    outputs = {output.name: output.shape[-1] for output in model.session.get_outputs()}
    expected = 2 if pointer == "flmp" else 1 + window  # the memory row, then the tokens it read (combined_map)
    if (slots := outputs["attn_a_fwd"]) != expected:
        raise ValueError(f"the attention has {slots} slots, not those of metadata.pointer {pointer}, window {window}")
    sizes = [positive_int(limits, key) for key in ("max_tokens", "max_characters", "max_batch_pairs")]
    vectors = WordVectors.from_glove(np.asarray(model.assets["special_vectors"]), model.assets["vocabulary"])
    embeddings = _embedding_limits(model) if model.graphs else {}
    return SimilarityState(vectors, *sizes, tuple(labels), embeddings, PARAPHRASE_OUTPUT in outputs)


def _embedding_limits(model: ServedModel) -> dict[str, Any]:
    """Limits of the encoder and head graphs; the encoder id hashes the files a sentence vector depends on."""
    entry = model.entry
    if set(model.graphs) != {"encoder", "head"}:
        raise ValueError(f"graphs must be both encoder and head, not {sorted(model.graphs)}")
    dimension = positive_int(entry.metadata, "embedding_dim")
    if (output_width := model.graphs["encoder"].session.get_outputs()[0].shape[-1]) != dimension:
        raise ValueError(f"metadata.embedding_dim is {dimension}, but the encoder graph returns {output_width}")
    parts = [entry.graphs["encoder"].sha256, *(entry.assets[key].sha256 for key in ("special_vectors", "vocabulary"))]
    encoder = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    max_sentences = positive_int(entry.limits, "max_sentences")
    return {"embedding_dim": dimension, "max_sentences": max_sentences, "encoder": encoder}


def describe(model: ServedModel) -> dict[str, Any]:
    state: SimilarityState = model.state
    paraphrase = {"paraphrase_labels": list(PARAPHRASE_LABELS)} if state.paraphrase else {}
    return {"max_tokens": state.max_tokens, "entailment_labels": list(state.labels), **state.embeddings, **paraphrase}


def encode_sentence(model: ServedModel, text: str, location: Location) -> EncodedSentence:
    """Tokenize and embed one sentence; over the model's limits or without words is a 422 naming the field."""
    state: SimilarityState = model.state
    if len(text) > state.max_characters:
        problem = f"has {len(text)} characters; at most {state.max_characters}"
    elif CONTROL_CHARACTER.search(text):
        problem = "must not contain control characters (other than tab, newline and carriage return)"
    elif len(tokens := tokenize(text)) <= 2:
        problem = "has no words after removing punctuation, invisible characters and combining marks with no letter"
    elif len(tokens) > state.max_tokens:
        limit = f"model {model.name} accepts at most {state.max_tokens} (including the <s> and </s> markers)"
        problem = f"has {len(tokens)} tokens; {limit}"
    else:
        return EncodedSentence(tokens, *state.vectors.embed(tokens))
    field = f"{location[-2]}[{location[-1]}]" if isinstance(location[-1], int) else location[-1]  # sentences[2]
    raise InvalidInput(location, f"{field} {problem}")


def encode_pairs(
    model: ServedModel, texts: Sequence[tuple[str, str]], locations: Sequence[Location]
) -> list[EncodedPair]:
    """Encode every pair (`locations[i]` is where pair i sits in the request body)."""
    located = [
        (text, (*location, field))
        for (a, b), location in zip(texts, locations, strict=True)
        for field, text in (("sentence_a", a), ("sentence_b", b))
    ]
    sentences = encode_each(model, located, f"{len(texts)} pairs", model.state.max_batch_pairs, len(texts), "pairs")
    return list(zip(sentences[::2], sentences[1::2], strict=True))


def encode_each(
    model: ServedModel, located: Sequence[tuple[str, Location]], counted: str, limit: int, count: int, field: str
) -> list[EncodedSentence]:
    """Each `(text, location)` encoded; more than `limit` items in the body's `field` is a 422 saying `counted`."""
    if count > limit:
        raise InvalidInput(("body", field), f"{counted}; model {model.name} accepts at most {limit} per request")
    return each_checked(partial(encode_sentence, model, text, location) for text, location in located)


def pair_feeds(pair: EncodedPair) -> Feeds:
    """One batch row: both sentences padded to the longer one's length (`emb_a`'s axis 1)."""
    a, b = pair
    emb = pad_rows([a.vectors[np.newaxis], b.vectors[np.newaxis]], max(len(a.tokens), len(b.tokens)))
    lengths = np.array([[len(a.tokens)], [len(b.tokens)]], dtype=np.int64)
    return {"emb_a": emb[:1], "len_a": lengths[0], "emb_b": emb[1:], "len_b": lengths[1]}


async def run_pairs(model: ServedModel, pairs: Sequence[EncodedPair]) -> list[Feeds]:
    """Each pair's graph outputs; the pairs join the model's batches (with other requests' pairs)."""
    return await model.batcher.run_all([(feeds, 1, feeds["emb_a"].shape[1]) for feeds in map(pair_feeds, pairs)])


def scores(model: ServedModel, outputs: Feeds) -> dict[str, Any]:
    """Relatedness, similarity and (with entailment labels) entailment of the first row of the pair or head graph."""
    state: SimilarityState = model.state
    relatedness = float(outputs["relatedness"][0])
    answer = {"model": model.name, "relatedness": relatedness, "similarity": (relatedness - 1) / 4}
    if not state.labels:
        return answer
    logits = outputs["entailment_logits"][0].tolist()  # three numbers: Python floats beat numpy's call overhead
    largest = max(logits)
    exponentials = [math.exp(logit - largest) for logit in logits]
    total = sum(exponentials)
    probabilities = [value / total for value in exponentials]
    label = state.labels[probabilities.index(max(probabilities))]
    answer["entailment"] = {"label": label, "probabilities": dict(zip(state.labels, probabilities, strict=True))}
    return answer


def decode(model: ServedModel, pair: EncodedPair, outputs: Feeds, return_attention: bool) -> dict[str, Any]:
    """The response fields of one pair (numpy arrays where the response has matrices)."""
    answer = scores(model, outputs)
    if model.state.paraphrase:  # the probability of PARAPHRASE, the sigmoid of the logit (never overflowing)
        logit = float(outputs[PARAPHRASE_OUTPUT][0])
        exponential = math.exp(-abs(logit))
        probability = 1 / (1 + exponential) if logit >= 0 else exponential / (1 + exponential)
        answer["paraphrase"] = {"label": PARAPHRASE_LABELS[logit >= 0], "probability": probability}
    a, b = pair
    unknown = list(dict.fromkeys(a.unknown + b.unknown))
    answer |= {"tokens_a": a.tokens, "tokens_b": b.tokens, "unknown_tokens": unknown, "attention": None}
    if return_attention:
        answer["attention"] = {
            f"sentence_{s}": combined_map(outputs[f"attn_{s}_fwd"][0, :n], outputs[f"attn_{s}_bwd"][0, :n])
            for s, n in (("a", len(a.tokens)), ("b", len(b.tokens)))
        }
    return answer


@lru_cache(maxsize=512)
def _cells(length: int, slots: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flat indices of what a memory row read: into its [L,K] weights, its [L,L] map, and that map flipped back."""
    steps = np.arange(length)
    sources = steps[:, None] - slots + 2 + np.arange(slots - 1)[None, :]  # [L, K-1]: token read in slots 1..K-1
    valid = sources >= 0
    step, token = np.broadcast_to(steps[:, None], sources.shape)[valid], sources[valid]
    slot = np.broadcast_to(np.arange(1, slots), sources.shape)[valid]
    flipped = (length - 1 - step) * length + (length - 1 - token)
    return step * slots + slot, step * length + token, flipped


def combined_map(forward: np.ndarray, backward: np.ndarray) -> np.ndarray:
    """One sentence's `len x len` attention map (MODELS.md §2.5) from both passes' [L,H,K] memory-row weights, averaged
    over passes and heads: at step t, slots 1..K-1 read tokens t-K+2..t (slot 0 is the memory row itself)."""
    length, heads, slots = forward.shape
    read, cells, flipped = _cells(length, slots)
    result = np.zeros(length * length, dtype=np.float32)
    result[cells] = forward.sum(axis=1, dtype=np.float32).ravel()[read]
    result[flipped] += backward.sum(axis=1, dtype=np.float32).ravel()[read]
    result *= 0.5 / heads
    return result.reshape(length, length)


def graph_of(model: ServedModel, key: str) -> ServedModel:
    """The model's `encoder` or `head` graph (which admits the request, so `state.embeddings` is set); 404 if none."""
    if not model.graphs:
        raise UnknownModel(f"Model {model.name} has no sentence encoder graph, so it serves no embeddings.")
    return model.graphs[key]


async def embed(model: ServedModel, sentences: Sequence[EncodedSentence]) -> list[np.ndarray]:
    """The sentence vector of each sentence; each is one row in the encoder's batches (with other requests')."""
    lengths = [len(sentence.tokens) for sentence in sentences]
    requests = [
        ({"emb": sentence.vectors[np.newaxis], "len": np.array([length], dtype=np.int64)}, 1, length)
        for sentence, length in zip(sentences, lengths, strict=True)
    ]
    return [output["embedding"][0] for output in await graph_of(model, "encoder").batcher.run_all(requests)]


def vector_pair(model: ServedModel, body: EmbeddingPairRequest) -> Feeds:
    """Head feeds for two stored vectors; an `encoder_a`/`encoder_b` that is not this model's, or a vector of the
    wrong size, is a 422 naming the field (all such fields)."""
    encoder, dimension, name = model.state.embeddings["encoder"], model.state.embeddings["embedding_dim"], model.name
    errors = [
        InvalidInput(
            field,
            f"{field} is not {encoder!r}, the encoder of model {name}: the vector was made by another model or "
            "another version of it, and this model's head would score it as noise; embed the sentence again with "
            f"POST /embeddings and model {name}",
        )
        for field in ("encoder_a", "encoder_b")
        if getattr(body, field) not in (None, encoder)
    ] + [
        InvalidInput(
            field,
            f"{field} has {len(values)} values; model {name} takes sentence vectors of {dimension} (from "
            "POST /embeddings with the same model)",
        )
        for field, values in (("embedding_a", body.embedding_a), ("embedding_b", body.embedding_b))
        if len(values) != dimension
    ]
    if errors:
        raise InvalidInput.joined(errors)
    return {field: np.array([getattr(body, field)], dtype=np.float32) for field in ("embedding_a", "embedding_b")}
