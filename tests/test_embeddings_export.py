"""export/embeddings.py on a freshly trained tiny model: graphs of the pair graph's weights, manifest, card, serving."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from tests.conftest import SIM_MODEL, toy_settings

pytest.importorskip("torch", reason="the exporter needs the train extra")

from export import embeddings as export_embeddings


@pytest.fixture(scope="module")
def exported(tiny_artifacts: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A copy of the tiny pipeline's artifacts with the embedding graphs of its VLMP model; and the SICK data."""
    artifacts = Path(shutil.copytree(tiny_artifacts, tmp_path_factory.mktemp("embeddings") / "artifacts"))
    data = tiny_artifacts.parent / "sick"
    export_embeddings.main(["--name", SIM_MODEL, "--artifacts", str(artifacts), "--data-dir", str(data)])
    return artifacts, data


def test_the_rebuilt_model_matches_the_pair_graph(tiny_artifacts):
    entry = next(
        e for e in json.loads((tiny_artifacts / "manifest.json").read_text())["models"] if e["name"] == SIM_MODEL
    )
    metadata = entry["metadata"]
    model = export_embeddings.model_from_pair_graph(
        tiny_artifacts / entry["file"], metadata["pointer"], metadata["window"], metadata["heads"]
    )
    assert model.config.mem_size == metadata["memory_size"] and model.config.fc_dim == 16


def test_the_export_adds_verified_graphs_metrics_and_a_card_section(exported):
    artifacts, _ = exported
    entry = next(e for e in json.loads((artifacts / "manifest.json").read_text())["models"] if e["name"] == SIM_MODEL)
    assert set(entry["graphs"]) == {"encoder", "head"} and all(len(g["sha256"]) == 64 for g in entry["graphs"].values())
    assert entry["limits"]["max_sentences"] == export_embeddings.MAX_SENTENCES
    assert entry["metadata"]["embedding_dim"] == 2 * entry["metadata"]["memory_size"]
    assert -1 <= entry["metrics"]["test_embedding_cosine_pearson"] <= 1
    card = (artifacts / entry["card"]).read_text()
    assert card.count(export_embeddings.CARD_HEADING) == 1 and "python -m export.embeddings" in card


def test_a_second_export_is_identical_and_keeps_one_card_section(exported, tmp_path):
    artifacts, data = exported
    again = Path(shutil.copytree(artifacts, tmp_path / "again"))
    export_embeddings.main(["--name", SIM_MODEL, "--artifacts", str(again), "--data-dir", str(data)])
    for part in ("encoder", "head"):
        name = f"{SIM_MODEL}.{part}.onnx"
        assert (again / name).read_bytes() == (artifacts / name).read_bytes()
    assert (again / f"{SIM_MODEL}.md").read_text() == (artifacts / f"{SIM_MODEL}.md").read_text()


def test_the_served_graphs_score_stored_vectors_like_the_pair_graph(exported):
    artifacts, _ = exported
    pair = {"sentence_a": "a man plays a guitar", "sentence_b": "a woman cuts an onion"}
    with TestClient(create_app(toy_settings(artifacts))) as client:
        vectors = client.post("/embeddings", json={"sentences": list(pair.values())}).json()["results"]
        direct = client.post("/similarity", json=pair).json()
        stored = client.post(
            "/similarity/from-embeddings",
            json={"embedding_a": vectors[0]["embedding"], "embedding_b": vectors[1]["embedding"]},
        ).json()
    assert stored["relatedness"] == pytest.approx(direct["relatedness"], abs=1e-5)
    np.testing.assert_allclose(
        list(stored["entailment"]["probabilities"].values()),
        list(direct["entailment"]["probabilities"].values()),
        atol=1e-5,
    )
