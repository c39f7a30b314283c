"""POST /embeddings and /similarity/from-embeddings over HTTP on the committed LSTM_RMC models (real onnxruntime)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.core.manifest import ModelLoadError
from tests.conftest import COMMITTED, FLMP_MODEL, SIM_MODEL
from tests.helpers import app_client
from tests.toy_profiles import flat_cost

PAIRS = [
    ("A man is playing a guitar.", "A person plays an instrument."),
    ("A man is playing a guitar.", "A man is not playing a guitar."),
    ("Two dogs are running through the snow.", "A woman is slicing an onion, qzxqzx!"),
]
SHORT = "A dog runs."
SIM_METADATA = next(
    m["metadata"] for m in json.loads((COMMITTED / "manifest.json").read_text())["models"] if m["name"] == SIM_MODEL
)
# the default model's sentence vector: final forward and backward memory (2 x memory_size) per member
WIDTH = SIM_METADATA["embedding_dim"]
LONG = "A group of children in colourful uniforms is playing football on a very large field near the old school."


def embed(client: TestClient, sentences: list[str], model: str | None = None) -> dict:
    response = client.post("/embeddings", json={"sentences": sentences, "model": model})
    assert response.status_code == 200, response.text
    return response.json()


def test_embeddings_return_the_sentence_vectors_and_tokens(client):
    body = embed(client, [PAIRS[2][1], SHORT])
    info = {m["name"]: m for m in client.get("/models").json()["models"]}[SIM_MODEL]
    assert body["model"] == SIM_MODEL and body["embedding_dim"] == info["embedding_dim"] == WIDTH
    assert 2 * SIM_METADATA["memory_size"] * SIM_METADATA.get("members", 1) == WIDTH
    assert info["max_sentences"] == 256
    first, second = body["results"]
    assert first["tokens"] == ["<s>", "a", "woman", "is", "slicing", "an", "onion", "qzxqzx", "</s>"]
    assert first["unknown_tokens"] == ["qzxqzx"] and second["unknown_tokens"] == []
    assert all(
        len(result["embedding"]) == WIDTH and np.all(np.isfinite(result["embedding"])) for result in body["results"]
    )
    assert not np.allclose(first["embedding"], second["embedding"])


@pytest.mark.parametrize("model", [SIM_MODEL, FLMP_MODEL])
def test_scoring_two_stored_embeddings_equals_the_pair_endpoint(client, model):
    for sentence_a, sentence_b in PAIRS:
        vectors = [result["embedding"] for result in embed(client, [sentence_a, sentence_b], model)["results"]]
        pair = {"sentence_a": sentence_a, "sentence_b": sentence_b, "model": model, "return_attention": False}
        direct = client.post("/similarity", json=pair).json()
        stored = client.post(
            "/similarity/from-embeddings", json={"embedding_a": vectors[0], "embedding_b": vectors[1], "model": model}
        )
        assert stored.status_code == 200, stored.text
        stored = stored.json()
        assert stored["model"] == model
        assert stored["relatedness"] == pytest.approx(direct["relatedness"], abs=1e-5)
        assert stored["similarity"] == pytest.approx(direct["similarity"], abs=1e-5)
        assert stored["entailment"]["label"] == direct["entailment"]["label"]
        for label, probability in direct["entailment"]["probabilities"].items():
            assert stored["entailment"]["probabilities"][label] == pytest.approx(probability, abs=1e-5)


def test_embeddings_name_their_encoder_and_scoring_refuses_another_models_vectors(client):
    vlmp, flmp = embed(client, list(PAIRS[0]), SIM_MODEL), embed(client, list(PAIRS[0]), FLMP_MODEL)
    info = {m["name"]: m for m in client.get("/models").json()["models"]}
    assert vlmp["encoder"] == info[SIM_MODEL]["encoder"] and flmp["encoder"] == info[FLMP_MODEL]["encoder"]
    assert vlmp["encoder"] != flmp["encoder"] and re.fullmatch("[0-9a-f]{16}", vlmp["encoder"])
    vectors = {"embedding_a": vlmp["results"][0]["embedding"], "embedding_b": vlmp["results"][1]["embedding"]}
    checked = {**vectors, "encoder_a": vlmp["encoder"], "encoder_b": vlmp["encoder"], "model": SIM_MODEL}
    assert client.post("/similarity/from-embeddings", json=checked).status_code == 200
    assert client.post("/similarity/from-embeddings", json=vectors).status_code == 200  # unchecked, as before
    switched = {**checked, "model": FLMP_MODEL, "encoder_b": None}
    response = client.post("/similarity/from-embeddings", json=switched)
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["loc"] == ["body", "encoder_a"]
    assert flmp["encoder"] in error["msg"] and FLMP_MODEL in error["msg"]
    both = client.post("/similarity/from-embeddings", json={**switched, "encoder_b": vlmp["encoder"]})
    assert [error["loc"] for error in both.json()["detail"]] == [["body", "encoder_a"], ["body", "encoder_b"]]
    unencodable = client.post(  # a lone surrogate: the message must not echo it (the answer could not be encoded)
        "/similarity/from-embeddings",
        content=json.dumps({**switched, "encoder_a": "\ud800"}).encode(),
        headers={"content-type": "application/json"},
    )
    assert unencodable.status_code == 422 and unencodable.json()["detail"][0]["loc"] == ["body", "encoder_a"]
    resized = client.post("/similarity/from-embeddings", json={**switched, "embedding_a": [0.5] * (WIDTH // 2)})
    assert [error["loc"] for error in resized.json()["detail"]] == [["body", "encoder_a"], ["body", "embedding_a"]]


def test_the_encoder_follows_the_weights_not_the_name(artifacts_copy):
    def rename(entry: dict) -> None:
        if entry["name"] == FLMP_MODEL:
            entry["name"] = "rmc-flmp-renamed"

    with app_client(artifacts_copy) as client:
        before = embed(client, [SHORT], FLMP_MODEL)["encoder"]
    rewrite_manifest(artifacts_copy, rename)
    with app_client(artifacts_copy) as client:
        assert embed(client, [SHORT], "rmc-flmp-renamed")["encoder"] == before


def batch_sizes(client: TestClient, graph: str) -> tuple[float, float]:
    """(runs, rows) of a graph's batcher so far, from the batch-size histogram in /metrics."""
    metrics = client.get("/metrics").text
    values = {}
    for kind in ("count", "sum"):
        found = re.search(rf'^mnemo_batch_size_rows_{kind}\{{model="{re.escape(graph)}"\}} (\S+)$', metrics, re.M)
        values[kind] = float(found.group(1)) if found else 0.0
    return values["count"], values["sum"]


@contextmanager
def flat_costs(client: TestClient, model: str, graph: str) -> Iterator[None]:
    """While the block runs, the cost models of `model`'s `graph` are flat (10 ms a run whatever its rows), so that
    what is queued together runs together: the runs before taught them this machine's times, which under load can
    say that padding sentences together saves nothing (a cost all per cell). The learned ones are put back after."""
    instances = client.app.state.registry.models[model].graphs[graph].instances
    learned = [instance.cost for instance in instances]
    for instance in instances:
        instance.cost = flat_cost(0.01)
    try:
        yield
    finally:
        for instance, cost in zip(instances, learned, strict=True):
            instance.cost = cost


def test_an_embedding_does_not_depend_on_what_it_was_batched_with(client):
    alone = np.array(embed(client, [SHORT])["results"][0]["embedding"])
    runs_before, rows_before = batch_sizes(client, f"{SIM_MODEL}.encoder")
    with flat_costs(client, SIM_MODEL, "encoder"):
        mixed = embed(client, [LONG, SHORT, PAIRS[0][0], LONG + " " + LONG])["results"]
    runs_after, rows_after = batch_sizes(client, f"{SIM_MODEL}.encoder")
    assert rows_after - rows_before == 4 and runs_after - runs_before < 4  # padded together in the batcher
    np.testing.assert_allclose(mixed[1]["embedding"], alone, atol=1e-5)
    again = embed(client, [LONG])["results"][0]["embedding"]
    np.testing.assert_allclose(mixed[0]["embedding"], again, atol=1e-5)


@pytest.mark.parametrize(
    ("body", "location", "words"),
    [
        ({"sentences": []}, ["body", "sentences"], ""),
        ({"sentences": ["a"] * 257}, ["body", "sentences"], ""),
        ({"sentences": ["fine", "!!!"]}, ["body", "sentences", 1], ""),
        ({"sentences": ["fine", "word " * 63]}, ["body", "sentences", 1], "sentences[1] has 65 tokens"),
        ({"sentences": "a single string"}, ["body", "sentences"], ""),
        ({"sentences": ["a"], "extra": 1}, ["body", "extra"], ""),
    ],
)
def test_invalid_embedding_requests_are_422_naming_the_field(client, body, location, words):
    response = client.post("/embeddings", json=body)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert any(error["loc"] == location and words in error["msg"] for error in detail), detail


def test_token_limit_message_names_the_limit(client):
    detail = client.post("/embeddings", json={"sentences": ["x " * 70]}).json()["detail"][0]
    assert detail["loc"] == ["body", "sentences", 0] and "at most 64" in detail["msg"]


@pytest.mark.parametrize(
    ("body", "location", "words"),
    [
        (
            {"embedding_a": [0.5] * (WIDTH - 1), "embedding_b": [0.5] * WIDTH},
            ["body", "embedding_a"],
            f"takes sentence vectors of {WIDTH}",
        ),
        ({"embedding_a": [0.5] * WIDTH, "embedding_b": [0.5] * 600}, ["body", "embedding_b"], "has 600 values"),
        ({"embedding_a": [], "embedding_b": [0.5] * WIDTH}, ["body", "embedding_a"], ""),
        ({"embedding_a": [0.5] * WIDTH, "embedding_b": [0.5] * 4097}, ["body", "embedding_b"], ""),
        ({"embedding_a": ["x"] * WIDTH, "embedding_b": [0.5] * WIDTH}, ["body", "embedding_a", 0], ""),
        ({"embedding_a": ["1"] * WIDTH, "embedding_b": [0.5] * WIDTH}, ["body", "embedding_a", 0], "valid number"),
        ({"embedding_a": [0.5] * WIDTH, "embedding_b": [True] * WIDTH}, ["body", "embedding_b", 0], "valid number"),
        ({"embedding_a": [1e7] * WIDTH, "embedding_b": [0.5] * WIDTH}, ["body", "embedding_a", 0], ""),
        ({"embedding_a": [0.5] * WIDTH}, ["body", "embedding_b"], ""),
    ],
)
def test_invalid_vector_pairs_are_422_naming_the_field(client, body, location, words):
    response = client.post("/similarity/from-embeddings", json=body)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert any(error["loc"] == location and words in error["msg"] for error in detail), detail


def test_unknown_model_is_404(client):
    response = client.post("/embeddings", json={"sentences": ["a"], "model": "dkvmn-assist2009"})
    assert response.status_code == 404 and SIM_MODEL in response.json()["detail"]


def rewrite_manifest(artifacts: Path, change) -> None:
    path = artifacts / "manifest.json"
    manifest = json.loads(path.read_text())
    for entry in manifest["models"]:
        change(entry)
    path.write_text(json.dumps(manifest))


def test_the_manifest_limit_on_sentences_is_enforced(artifacts_copy):
    def lower_limit(entry: dict) -> None:
        if entry["name"] == SIM_MODEL:
            entry["limits"]["max_sentences"] = 2

    rewrite_manifest(artifacts_copy, lower_limit)
    with app_client(artifacts_copy) as client:
        assert client.post("/embeddings", json={"sentences": ["a", "b"]}).status_code == 200
        response = client.post("/embeddings", json={"sentences": ["a", "b", "c"]})
    assert response.status_code == 422
    detail = response.json()["detail"][0]
    assert detail["loc"] == ["body", "sentences"] and "at most 2 per request" in detail["msg"]


def test_a_model_without_embedding_graphs_answers_404_and_still_serves_pairs(artifacts_copy):
    def drop_graphs(entry: dict) -> None:
        if entry["name"] == FLMP_MODEL:
            entry.pop("graphs")

    rewrite_manifest(artifacts_copy, drop_graphs)
    with app_client(artifacts_copy) as client:
        response = client.post("/embeddings", json={"sentences": ["a"], "model": FLMP_MODEL})
        assert response.status_code == 404 and "no sentence encoder" in response.json()["detail"]
        vectors = {"embedding_a": [0.5] * 512, "embedding_b": [0.5] * 512, "model": FLMP_MODEL}
        assert client.post("/similarity/from-embeddings", json=vectors).status_code == 404
        pair = {"sentence_a": "a man", "sentence_b": "a dog", "model": FLMP_MODEL}
        assert client.post("/similarity", json=pair).status_code == 200


def test_a_tampered_encoder_graph_is_never_served(artifacts_copy):
    encoder = artifacts_copy / f"{SIM_MODEL}.encoder.onnx"
    encoder.write_bytes(encoder.read_bytes()[:-1] + b"\0")
    with app_client(artifacts_copy, on_model_error="skip") as client:
        info = {m["name"]: m for m in client.get("/models").json()["models"]}[SIM_MODEL]
        assert not info["ready"] and f"{SIM_MODEL}.encoder.onnx" in info["error"]
        assert client.post("/embeddings", json={"sentences": ["a"]}).status_code == 503


def test_a_graph_the_task_does_not_use_stops_that_model(artifacts_copy):
    def add_unknown_graph(entry: dict) -> None:
        if entry["name"] == FLMP_MODEL:
            entry["graphs"]["decoder"] = entry["graphs"]["head"]

    rewrite_manifest(artifacts_copy, add_unknown_graph)
    with app_client(artifacts_copy, on_model_error="skip") as client:
        info = {m["name"]: m for m in client.get("/models").json()["models"]}
        assert info[SIM_MODEL]["ready"] and not info[FLMP_MODEL]["ready"]
        assert "'decoder'" in info[FLMP_MODEL]["error"] and "encoder, head" in info[FLMP_MODEL]["error"]


def test_a_model_whose_metadata_does_not_describe_its_attention_stops_that_model(artifacts_copy):
    def widen_window(entry: dict) -> None:
        if entry["name"] == SIM_MODEL:
            entry["metadata"]["window"] += 1

    rewrite_manifest(artifacts_copy, widen_window)
    with app_client(artifacts_copy, on_model_error="skip") as client:
        info = {m["name"]: m for m in client.get("/models").json()["models"]}
        assert info[FLMP_MODEL]["ready"] and not info[SIM_MODEL]["ready"]
        assert "6 slots" in info[SIM_MODEL]["error"] and "window 6" in info[SIM_MODEL]["error"]


@pytest.mark.parametrize(
    "labels",
    [["A", "A", "B"], ["A", "", "B"], ["A", "B\u202e", "C"], ["A", "B"], "ABC"],
    ids=["twice", "empty", "bidi", "two", "string"],
)
def test_entailment_labels_other_than_three_distinct_names_stop_startup_naming_the_field(artifacts_copy, labels):
    def relabel(entry: dict) -> None:
        if entry["name"] == SIM_MODEL:
            entry["metadata"]["entailment_labels"] = labels

    rewrite_manifest(artifacts_copy, relabel)
    expected = rf"^model {SIM_MODEL}: metadata\.entailment_labels must list 3 distinct printable labels"
    with pytest.raises(ModelLoadError, match=expected) as raised, app_client(artifacts_copy, models=SIM_MODEL):
        pass
    assert "\u202e" not in str(raised.value)
