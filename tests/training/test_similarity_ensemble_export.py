"""export/similarity_ensemble.py on tiny trained runs: one graph, card, manifest, and the service serving it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import app_client
from tests.synthetic_data import write_sick

pytest.importorskip("torch", reason="the exporter needs the train extra")

from export import similarity_ensemble
from export.similarity import MAX_CELLS, PAPER
from models import train_sim

pytestmark = pytest.mark.slow  # each test starts a server, a browser or a training run: seconds (-m "not slow")

NAME = "rmc-vlmp-ensemble"
TINY = ["--pointer", "vlmp", "--heads", "2", "--head-size", "8", "--fc-dim", "16", "--epochs", "1", "--no-progress"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    """Three tiny runs sharing their special-token vectors, exported as a 3-member ensemble."""
    root = tmp_path_factory.mktemp("ensemble")
    data = write_sick(root / "sick")
    runs = [root / f"seed{seed}" for seed in (1, 2, 3)]
    for seed, run in zip((1, 2, 3), runs, strict=True):
        common = ["--data-dir", str(data), "--specials-seed", "5", "--seed", str(seed), "--out", str(run)]
        train_sim.main([*TINY, *common])
    artifacts = root / "artifacts"
    options = ["--name", NAME, "--artifacts", str(artifacts), "--data-dir", str(data), "--members", "3"]
    similarity_ensemble.main([*(f"--run={run}" for run in runs), *options, "--latency-repeats", "2"])
    return artifacts, runs


def test_the_manifest_and_card_describe_every_member(exported):
    artifacts, runs = exported
    entry = json.loads((artifacts / "manifest.json").read_text())["models"][0]
    assert entry["name"] == NAME and entry["metadata"]["members"] == 3
    assert entry["metadata"]["embedding_dim"] == 3 * 2 * entry["metadata"]["memory_size"]
    assert set(entry["graphs"]) == {"encoder", "head"}
    card = (artifacts / entry["card"]).read_text()
    assert all(f"`{run.name}`" in card for run in runs)
    assert "3 (exported)" in card and "## Latency" in card and "## Sentence embeddings" in card
    runs_flags = " ".join(f"--run {run}" for run in runs)
    command = f"{runs_flags} --name {NAME} --members 3 --artifacts {artifacts} --data-dir {artifacts.parent / 'sick'}"
    assert f"- Command: `python -m export.similarity_ensemble {command} --latency-repeats 2`" in card


def test_members_with_other_special_vectors_are_refused(exported, tmp_path):
    _, runs = exported
    data = write_sick(tmp_path / "sick")
    other = tmp_path / "other"
    train_sim.main([*TINY, "--data-dir", str(data), "--seed", "4", "--out", str(other)])
    with pytest.raises(SystemExit, match="special-token vectors"):
        similarity_ensemble.main([f"--run={runs[0]}", f"--run={other}", "--name", NAME, "--select-only"])


def test_the_service_serves_the_ensemble_and_its_stored_vectors_alike(exported):
    artifacts, _ = exported
    pair = {"sentence_a": "a man plays a guitar", "sentence_b": "a woman cuts an onion"}
    with app_client(artifacts) as client:
        direct = client.post("/similarity", json={**pair, "return_attention": True})
        vectors = client.post("/embeddings", json={"sentences": list(pair.values())}).json()["results"]
        stored = client.post(
            "/similarity/from-embeddings",
            json={"embedding_a": vectors[0]["embedding"], "embedding_b": vectors[1]["embedding"]},
        ).json()
    assert direct.status_code == 200
    direct = direct.json()
    assert 1.0 <= direct["relatedness"] <= 5.0
    attention = np.array(direct["attention"]["sentence_a"])
    assert attention.shape == (len(direct["tokens_a"]),) * 2 and (attention >= 0).all()
    assert stored["relatedness"] == pytest.approx(direct["relatedness"], abs=1e-5)
    np.testing.assert_allclose(
        list(stored["entailment"]["probabilities"].values()),
        list(direct["entailment"]["probabilities"].values()),
        atol=1e-5,
    )


@pytest.fixture(scope="module")
def exported_flmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two tiny FLMP runs exported as a 2-member ensemble, not the default model."""
    root = tmp_path_factory.mktemp("flmp-ensemble")
    data = write_sick(root / "sick")
    runs = [root / f"flmp{seed}" for seed in (1, 2)]
    flmp = ["flmp" if part == "vlmp" else part for part in TINY]
    for seed, run in zip((1, 2), runs, strict=True):
        common = ["--data-dir", str(data), "--specials-seed", "5", "--seed", str(seed), "--out", str(run)]
        train_sim.main([*flmp, *common])
    artifacts = root / "artifacts"
    options = ["--name", "rmc-flmp-ensemble", "--artifacts", str(artifacts), "--data-dir", str(data)]
    similarity_ensemble.main([*(f"--run={run}" for run in runs), *options, "--members", "2", "--latency-repeats", "2"])
    return artifacts


def test_an_flmp_ensemble_is_described_as_flmp(exported_flmp):
    entry = json.loads((exported_flmp / "manifest.json").read_text())["models"][0]
    assert entry["metadata"]["pointer"] == "flmp" and entry["metadata"]["members"] == 2
    assert entry["default"] is False
    assert entry["batching"]["max_cells"] == MAX_CELLS["flmp"] // 2
    assert entry["metrics"]["paper_pearson"] == PAPER["flmp"]["pearson"]
    card = (exported_flmp / entry["card"]).read_text()
    assert "VLMP" not in card and "window" not in card
    assert "paper (FLMP, GloVe 840B 300d)" in card and "the map is diagonal" in card and "[B,T,2,2]" in card


def test_the_service_serves_the_flmp_ensemble_with_diagonal_maps(exported_flmp):
    pair = {"sentence_a": "a man plays a guitar", "sentence_b": "a woman cuts an onion", "return_attention": True}
    with app_client(exported_flmp) as client:
        response = client.post("/similarity", json=pair)
    assert response.status_code == 200
    attention = np.array(response.json()["attention"]["sentence_a"])
    assert attention.shape == (len(response.json()["tokens_a"]),) * 2
    assert np.count_nonzero(attention - np.diag(np.diag(attention))) == 0 and (np.diag(attention) > 0).all()
