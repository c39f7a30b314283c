"""Sentence-pair inference around an LSTM_RMC ONNX graph (numpy only).

Graph inputs: emb_a, emb_b [B,T,50] float32 (both padded to one T), len_a, len_b [B] int64.
Outputs: relatedness_log_probs [B,5], relatedness [B], entailment_logits [B,3] and the memory-row
attention of the four encoder passes attn_{a,b}_{fwd,bwd} [B,T,H,K] (K = 1 + w for VLMP, 2 for FLMP;
index 0 is the memory attending to itself, zeros on padded steps).

Attention maps (MODELS.md §2.5): for one direction, row t holds the head-averaged weights the memory
gave each token while reading step t (VLMP: the tokens of the window t-w+1..t; FLMP: token t only).
The backward pass reads the sentence reversed; its map is flipped back to the original token order.
The returned map is the mean of the two directions, `len(tokens) x len(tokens)`, non-negative; a
row sums to less than 1 by the weight the memory kept on itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from app.inference.tokenizer import tokenize
from app.inference.word_vectors import WordVectors

ENTAILMENT_LABELS = ("ENTAILMENT", "NEUTRAL", "CONTRADICTION")
RunGraph = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


@dataclass(frozen=True)
class EncodedSentence:
    tokens: list[str]
    vectors: np.ndarray  # [len(tokens), 50]
    unknown: list[str]


@dataclass(frozen=True)
class PairResult:
    relatedness: float
    entailment: np.ndarray  # probabilities in ENTAILMENT_LABELS order
    sentence_a: EncodedSentence
    sentence_b: EncodedSentence
    attention_a: np.ndarray | None
    attention_b: np.ndarray | None


def encode(text: str, vectors: WordVectors) -> EncodedSentence:
    """Tokenize and look up the word vectors of one sentence."""
    tokens = tokenize(text)
    matrix, unknown = vectors.embed(tokens)
    return EncodedSentence(tokens, matrix, unknown)


def direction_map(weights: np.ndarray, pointer: str, window: int) -> np.ndarray:
    """[L,H,K] per-step memory-row weights of one pass -> [L,L] map in that pass's reading order."""
    mean = weights.mean(axis=1)  # heads averaged: [L,K]
    length = len(mean)
    result = np.zeros((length, length), dtype=np.float32)
    if pointer == "flmp":
        result[np.arange(length), np.arange(length)] = mean[:, 1]
        return result
    for step in range(length):
        for slot in range(window):
            source = step - window + 1 + slot
            if source >= 0:
                result[step, source] = mean[step, 1 + slot]
    return result


def combined_map(forward: np.ndarray, backward: np.ndarray, pointer: str, window: int) -> np.ndarray:
    """Mean of the forward map and the backward map re-indexed to the original token order."""
    backward_map = direction_map(backward, pointer, window)[::-1, ::-1]
    return (direction_map(forward, pointer, window) + backward_map) / 2


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def score_pairs(
    run: RunGraph,
    pairs: list[tuple[EncodedSentence, EncodedSentence]],
    pointer: str,
    window: int,
    return_attention: bool,
) -> list[PairResult]:
    """Run a batch of encoded pairs through the graph in one call."""
    length = max(max(len(a.tokens), len(b.tokens)) for a, b in pairs)
    dim = pairs[0][0].vectors.shape[1]
    emb_a = np.zeros((len(pairs), length, dim), dtype=np.float32)
    emb_b = np.zeros_like(emb_a)
    for row, (a, b) in enumerate(pairs):
        emb_a[row, : len(a.tokens)] = a.vectors
        emb_b[row, : len(b.tokens)] = b.vectors
    outputs = run(
        {
            "emb_a": emb_a,
            "len_a": np.array([len(a.tokens) for a, _ in pairs], dtype=np.int64),
            "emb_b": emb_b,
            "len_b": np.array([len(b.tokens) for _, b in pairs], dtype=np.int64),
        }
    )
    entailment = _softmax(outputs["entailment_logits"].astype(np.float64))
    results = []
    for row, (a, b) in enumerate(pairs):
        attention_a = attention_b = None
        if return_attention:
            la, lb = len(a.tokens), len(b.tokens)
            attention_a = combined_map(
                outputs["attn_a_fwd"][row, :la], outputs["attn_a_bwd"][row, :la], pointer, window
            )
            attention_b = combined_map(
                outputs["attn_b_fwd"][row, :lb], outputs["attn_b_bwd"][row, :lb], pointer, window
            )
        results.append(PairResult(float(outputs["relatedness"][row]), entailment[row], a, b, attention_a, attention_b))
    return results
