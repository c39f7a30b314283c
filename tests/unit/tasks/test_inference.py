"""Serving-side numpy code: tokenizer, attention maps, word vectors."""

from __future__ import annotations

import numpy as np

from app.tasks.similarity.service import combined_map
from app.tasks.similarity.tokenizer import tokenize
from app.tasks.similarity.vectors import WordVectors, build_vocabulary, special_vectors


def test_tokenizer_strips_punctuation_lowercases_and_marks_numbers():
    assert tokenize("A man, 2 DOGS... and 3.5 cats!") == [
        "<s>",
        "a",
        "man",
        "<number>",
        "dogs",
        "and",
        "<number>",
        "cats",
        "</s>",
    ]
    assert tokenize("   ") == ["<s>", "</s>"]


def _weights(length: int, heads: int, width: int, slot: int) -> np.ndarray:
    """Per-step attention with all weight on one slot of the window."""
    weights = np.zeros((length, heads, width), dtype=np.float32)
    weights[:, :, slot] = 1.0
    return weights


def _forward_map(weights: np.ndarray) -> np.ndarray:
    """The forward pass's own map: the combined map with a backward pass that attends nothing, doubled."""
    return 2 * combined_map(weights, np.zeros_like(weights))


def test_vlmp_map_places_window_slots_on_the_right_tokens():
    window, length = 3, 5
    newest = _forward_map(_weights(length, 2, 1 + window, slot=window))
    np.testing.assert_array_equal(newest, np.eye(length))
    previous = _forward_map(_weights(length, 2, 1 + window, slot=window - 1))
    np.testing.assert_array_equal(previous, np.eye(length, k=-1))  # step t attends token t-1


def test_backward_pass_is_reindexed_to_the_original_token_order():
    window, length = 3, 5
    forward = np.zeros((length, 2, 1 + window), dtype=np.float32)
    backward = _weights(length, 2, 1 + window, slot=window - 1)  # reversed step t attends reversed token t-1
    combined = combined_map(forward, backward)
    np.testing.assert_array_equal(combined, np.eye(length, k=1) / 2)  # original token t+1


def test_flmp_map_is_diagonal_and_self_weight_is_excluded():
    weights = np.full((4, 8, 2), 0.5, dtype=np.float32)
    np.testing.assert_allclose(combined_map(weights, weights), np.eye(4) * 0.5)


def _reference_map(forward: np.ndarray, backward: np.ndarray, pointer: str, window: int) -> np.ndarray:
    """The combined map cell by cell, as MODELS.md states it: at step t, slot k of the memory row read token
    t-w+k (VLMP, slots 1..w) or token t (FLMP, slot 1); the backward pass read the sentence reversed."""
    length = len(forward)
    result = np.zeros((length, length), dtype=np.float64)
    reads = [(k, k - window) for k in range(1, window + 1)] if pointer == "vlmp" else [(1, 0)]
    for t in range(length):
        for slot, offset in reads:
            token = t + offset
            if token >= 0:
                result[t, token] += forward[t, :, slot].mean() / 2
                result[length - 1 - t, length - 1 - token] += backward[t, :, slot].mean() / 2
    return result


def test_attention_maps_match_the_cell_by_cell_definition():
    rng = np.random.default_rng(7)
    for pointer, window in (("vlmp", 1), ("vlmp", 3), ("vlmp", 5), ("flmp", 5)):
        width = 1 + (window if pointer == "vlmp" else 1)
        for length in (1, 2, 4, 9):
            forward, backward = (rng.random((length, 4, width), dtype=np.float32) for _ in range(2))
            combined = combined_map(forward, backward)
            assert combined.dtype == np.float32 and combined.flags.c_contiguous
            np.testing.assert_allclose(combined, _reference_map(forward, backward, pointer, window), atol=1e-6)


def test_every_glove_word_gets_its_vector_and_unknown_words_are_reported():
    specials = special_vectors(7)
    vectors = WordVectors.from_glove(specials)
    matrix, unknown = vectors.embed(["<s>", "guitar", "qzxqzxqzx", "</s>"])
    assert unknown == ["qzxqzxqzx"]
    np.testing.assert_array_equal(matrix[0], specials[0])
    np.testing.assert_array_equal(matrix[1], vectors.matrix[3822])  # "guitar" is row 3822 of GloVe 6B
    np.testing.assert_array_equal(matrix[2], specials[3])
    assert len(vectors.keys) == 400_000 and sorted(vectors.rows_of(["the", ",", ".", "of"])) == [0, 1, 2, 3]


def test_the_vocabulary_table_finds_every_word_it_was_built_from_and_nothing_else():
    words = ["the", "café", "naïve", "x" * 60, "ω", "<unk>-like"]
    table = build_vocabulary(words)
    vectors = WordVectors(np.zeros((len(words), 50), np.float32), table, special_vectors())
    assert vectors.rows_of(words).tolist() == list(range(len(words)))
    assert vectors.rows_of(["The", "cafe", "", "xx"]).tolist() == [-1, -1, -1, -1]
