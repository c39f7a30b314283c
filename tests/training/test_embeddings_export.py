"""export/embeddings.py on a freshly trained tiny model: graphs of the pair graph's weights, manifest, card, serving."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from tests.conftest import SIM_MODEL
from tests.helpers import ROOT, app_client

pytest.importorskip("torch", reason="the exporter needs the train extra")

import torch

from export import embeddings as export_embeddings

pytestmark = pytest.mark.slow  # each test starts a server, a browser or a training run: seconds (-m "not slow")


def export_command(artifacts: Path, data: Path) -> None:
    """`python -m export.embeddings` in its own process, as the cards say (the exporter's node names count up
    within one process, so only a fresh process gives the same bytes every time)."""
    command = [sys.executable, "-m", "export.embeddings", "--name", SIM_MODEL, "--artifacts", str(artifacts)]
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [*command, "--data-dir", str(data)], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]


@pytest.fixture(scope="module")
def exported(tiny_artifacts: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A copy of the tiny pipeline's artifacts with the embedding graphs of its VLMP model; and the SICK data."""
    artifacts = Path(shutil.copytree(tiny_artifacts, tmp_path_factory.mktemp("embeddings") / "artifacts"))
    data = tiny_artifacts.parent / "sick"
    export_command(artifacts, data)
    return artifacts, data


def test_the_rebuilt_model_matches_the_pair_graph(tiny_artifacts):
    entry = next(
        e for e in json.loads((tiny_artifacts / "manifest.json").read_text())["models"] if e["name"] == SIM_MODEL
    )
    metadata = entry["metadata"]
    pair_graph = tiny_artifacts / entry["file"]
    model = export_embeddings.model_from_pair_graph(
        pair_graph, metadata["pointer"], metadata["window"], metadata["heads"]
    )
    generator = np.random.default_rng(0)
    feeds = {
        "emb_a": generator.normal(size=(3, 9, 50)).astype(np.float32),
        "len_a": np.array([9, 4, 6]),
        "emb_b": generator.normal(size=(3, 9, 50)).astype(np.float32),
        "len_b": np.array([2, 9, 5]),
    }
    expected = ort.InferenceSession(str(pair_graph), providers=["CPUExecutionProvider"]).run(None, feeds)
    with torch.no_grad():
        rebuilt = model(*(torch.from_numpy(feeds[name]) for name in ("emb_a", "len_a", "emb_b", "len_b")))
    for mine, theirs in zip(rebuilt, expected, strict=True):
        np.testing.assert_allclose(mine.numpy(), theirs, atol=1e-4)


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
    export_command(again, data)
    for part in ("encoder", "head"):
        name = f"{SIM_MODEL}.{part}.onnx"
        assert (again / name).read_bytes() == (artifacts / name).read_bytes()
    assert (again / f"{SIM_MODEL}.md").read_text() == (artifacts / f"{SIM_MODEL}.md").read_text()


def test_the_served_graphs_score_stored_vectors_like_the_pair_graph(exported):
    artifacts, _ = exported
    pair = {"sentence_a": "a man plays a guitar", "sentence_b": "a woman cuts an onion"}
    with app_client(artifacts) as client:
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
