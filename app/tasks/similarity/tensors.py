"""Similarity models over the Open Inference Protocol: sentence pairs in, scores and tokens out, as on /similarity."""

from __future__ import annotations

import numpy as np

from app.core.errors import InvalidInput
from app.runtime.collate import Feeds
from app.runtime.model import Admission, ProtocolError, ServedModel, TensorSpec
from app.tasks.similarity import service
from app.tasks.similarity.service import EncodedPair

PLATFORM = "mnemo_similarity"
OUTPUTS = [
    TensorSpec("relatedness", "FP32", (-1,)),
    TensorSpec("entailment_probabilities", "FP32", (-1, 3)),
    TensorSpec("tokens_a", "BYTES", (-1, -1)),
    TensorSpec("tokens_b", "BYTES", (-1, -1)),
    TensorSpec("paraphrase_probability", "FP32", (-1,)),
]


def inputs(model: ServedModel) -> list[TensorSpec]:
    return [TensorSpec("sentence_a", "BYTES", (-1,)), TensorSpec("sentence_b", "BYTES", (-1,))]


def outputs(model: ServedModel) -> list[TensorSpec]:
    absent = {"entailment_probabilities": not model.state.labels, "paraphrase_probability": not model.state.paraphrase}
    return [spec for spec in OUTPUTS if not absent.get(spec.name)]


def prepare(model: ServedModel, tensors: dict[str, np.ndarray | None]) -> tuple[Admission, list[EncodedPair]]:
    """Tokenize and embed every pair, a row each; the service's limits answer 400 naming the input and element."""
    first, second = tensors["sentence_a"], tensors["sentence_b"]
    if len(first) != len(second):
        raise ProtocolError(f"sentence_a has {len(first)} elements and sentence_b {len(second)}; they must pair up")
    if len(first) == 0:
        raise ProtocolError("sentence_a and sentence_b hold no pair")
    texts = list(zip(first.tolist(), second.tolist(), strict=True))
    try:
        encoded = service.encode_pairs(model, texts, [(index,) for index in range(len(texts))])
    except InvalidInput as error:
        where = error.location[1:]  # ("body", index, "sentence_a") or ("body", "pairs")
        name = f"input {where[1]}[{where[0]}]" if len(where) == 2 else "inputs sentence_a/sentence_b"
        raise ProtocolError(f"{name}: {error.message}") from None
    return model.batcher.admit(len(encoded)), encoded


async def infer(model: ServedModel, pairs: list[EncodedPair]) -> Feeds:
    """Run the pairs in the model's batches and gather the protocol's output tensors (`outputs(model)`)."""
    outputs = await service.run_pairs(model, pairs)
    results = [service.decode(model, pair, out, False) for pair, out in zip(pairs, outputs, strict=True)]
    tensors = {"relatedness": np.array([result["relatedness"] for result in results], dtype=np.float32)}
    if model.state.labels:
        probabilities = [list(result["entailment"]["probabilities"].values()) for result in results]
        tensors["entailment_probabilities"] = np.array(probabilities, dtype=np.float32)
    if model.state.paraphrase:
        paraphrase = [result["paraphrase"]["probability"] for result in results]
        tensors["paraphrase_probability"] = np.array(paraphrase, dtype=np.float32)
    for name in ("tokens_a", "tokens_b"):
        width = max(len(result[name]) for result in results)  # padded with empty strings, never a token
        tensors[name] = np.array([result[name] + [""] * (width - len(result[name])) for result in results], object)
    return tensors
