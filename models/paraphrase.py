"""The MSRP paraphrase head, and the sentence vectors it reads from a served similarity model's encoder graph.

The head reads two sentence vectors u, v (GET /models: `embedding_dim`) on the features [u, v, |u-v|, u*v]
(the pair features of docs/MODELS.md §3.3), standardised with the training pairs' mean and deviation, through
Linear -> Tanh -> Linear to one logit of "paraphrase". Paraphrase is a symmetric relation, so the logit is the
mean of the head on (u, v) and on (v, u): the answer does not depend on which sentence comes first.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from torch import nn

from app.tasks.similarity.tokenizer import tokenize
from app.tasks.similarity.vectors import WordVectors

ENCODER_BATCH = 128  # sentences per encoder run, sorted by length so that little is padding


def pair_features(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.cat([u, v, (u - v).abs(), u * v], dim=-1)


class ParaphraseHead(nn.Module):
    """Two sentence vectors [B, D] -> the logit [B] that the two sentences are paraphrases."""

    def __init__(self, width: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.register_buffer("feature_mean", torch.zeros(4 * width))
        self.register_buffer("feature_scale", torch.ones(4 * width))
        self.layers = nn.Sequential(
            nn.Dropout(dropout), nn.Linear(4 * width, hidden), nn.Tanh(), nn.Dropout(dropout), nn.Linear(hidden, 1)
        )

    def standardise_with(self, u: torch.Tensor, v: torch.Tensor) -> None:
        """Set the feature mean and 1/deviation from training pairs, both orders (as `forward` reads them)."""
        features = torch.cat([pair_features(u, v), pair_features(v, u)])
        self.feature_mean.copy_(features.mean(0))
        self.feature_scale.copy_(1 / (features.std(0) + 1e-6))

    def one_order(self, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.layers((pair_features(u, v) - self.feature_mean) * self.feature_scale).squeeze(-1)

    def forward(self, embedding_a: torch.Tensor, embedding_b: torch.Tensor) -> torch.Tensor:
        return (self.one_order(embedding_a, embedding_b) + self.one_order(embedding_b, embedding_a)) / 2


def cpu_session(path: Path, threads: int) -> ort.InferenceSession:
    """An onnxruntime CPU session on `threads` threads (training shares the machine with other jobs)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def sentence_vectors(session: ort.InferenceSession, vectors: WordVectors, sentences: list[str]) -> np.ndarray:
    """[N, D]: the encoder graph's vector of each sentence, tokenized and embedded as the service does."""
    embedded = [vectors.embed(tokenize(sentence))[0] for sentence in sentences]
    order = np.argsort([len(sentence) for sentence in embedded], kind="stable")
    found = []
    for start in range(0, len(order), ENCODER_BATCH):
        batch = [embedded[row] for row in order[start : start + ENCODER_BATCH]]
        emb = np.zeros((len(batch), max(map(len, batch)), batch[0].shape[1]), dtype=np.float32)
        for row, sentence in enumerate(batch):
            emb[row, : len(sentence)] = sentence
        lengths = np.array([len(sentence) for sentence in batch], dtype=np.int64)
        found.append(session.run(["embedding"], {"emb": emb, "len": lengths})[0])
    result = np.empty((len(sentences), found[0].shape[1]), dtype=np.float32)
    result[order] = np.concatenate(found)
    return result
