"""The committed artifacts: every model is listed, verified, served, and behaves like a trained model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.core.settings import DEFAULT_ARTIFACTS_DIR
from tests.helpers import app_client

KT_MODELS = {"dkvmn-assist2009", "dkvmn-assist2015", "dkvmn-statics", "dkvmn-synthetic", "dkt-assist2009"}
SIMILARITY_MODELS = {"rmc-vlmp-sick", "rmc-flmp-sick", "rmc-vlmp-msrp"}
MAX_FILE_BYTES = 25 * 1024 * 1024


@pytest.fixture(scope="module")
def committed() -> Iterator[TestClient]:
    with app_client(DEFAULT_ARTIFACTS_DIR) as client:
        yield client


def test_manifest_lists_every_model_with_defaults_and_small_files():
    manifest = json.loads((DEFAULT_ARTIFACTS_DIR / "manifest.json").read_text())
    models = {m["name"]: m for m in manifest["models"]}
    assert set(models) == KT_MODELS | SIMILARITY_MODELS
    assert {name for name, model in models.items() if model["default"]} == {"dkvmn-assist2009", "rmc-vlmp-sick"}
    for model in models.values():
        assert Path(DEFAULT_ARTIFACTS_DIR / model["file"]).stat().st_size < MAX_FILE_BYTES
        assert (DEFAULT_ARTIFACTS_DIR / model["card"]).exists()


def test_every_committed_model_is_ready_on_cpu(committed):
    assert committed.get("/ready").status_code == 200
    listed = {m["name"]: m for m in committed.get("/models").json()["models"]}
    assert set(listed) == KT_MODELS | SIMILARITY_MODELS
    assert all(m["provider"] == "CPUExecutionProvider" and m["ready"] for m in listed.values())


@pytest.mark.parametrize("model", sorted(SIMILARITY_MODELS))
def test_identical_sentences_score_higher_than_unrelated_ones(committed, model):
    def relatedness(a: str, b: str) -> float:
        response = committed.post("/similarity", json={"sentence_a": a, "sentence_b": b, "model": model})
        assert response.status_code == 200
        return response.json()["relatedness"]

    same = relatedness("A man is playing a guitar.", "A man is playing a guitar.")
    unrelated = relatedness("A man is playing a guitar.", "Two dogs are running through the snow.")
    assert same > 4.0 > 2.5 > unrelated


def test_entailment_reads_contradiction_and_entailment(committed):
    def label(a: str, b: str) -> str:
        return committed.post("/similarity", json={"sentence_a": a, "sentence_b": b}).json()["entailment"]["label"]

    assert label("A man is playing a guitar.", "A man is not playing a guitar.") == "CONTRADICTION"
    assert label("A man is playing a guitar.", "A man is playing an instrument.") == "ENTAILMENT"


@pytest.mark.parametrize("model", sorted(KT_MODELS))
def test_right_answers_raise_the_next_prediction_more_than_wrong_ones(committed, model):
    def next_p(question: int, correct: bool) -> float:
        body = {"model": model, "interactions": [{"question": question, "correct": correct}] * 20}
        response = committed.post("/knowledge-trace", json={**body, "next_questions": [question]})
        assert response.status_code == 200
        return response.json()["next"][0]["p_correct"]

    gaps = [next_p(question, True) - next_p(question, False) for question in (5, 10, 20)]
    assert min(gaps) > 0 and sum(gaps) / len(gaps) > 0.3
