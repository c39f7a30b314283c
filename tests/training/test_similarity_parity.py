"""export.similarity's parity check on a tiny exported pair graph: pass, and fail without leaving the graph."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from app.tasks.similarity.vectors import WordVectors, special_vectors
from export.similarity import check_parity, export_pair_model
from models.rmc import RMCConfig, SentencePairModel
from models.sick_data import SickPair

pytestmark = pytest.mark.slow  # each test starts a server, a browser or a training run: seconds (-m "not slow")

PAIRS = [
    SickPair("A man is playing a guitar", "A person plays an instrument", 4.2, 0),
    SickPair("Two dogs run in the park", "Nobody is running", 1.5, 2),
    SickPair("The cat sleeps", "A cat is sleeping on the warm windowsill today", 4.8, 0),
]
FAILED = r"ONNX parity failed on real sentence pairs: "


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[SentencePairModel, Path, WordVectors]:
    """A tiny random VLMP pair model and its graph."""
    torch.manual_seed(0)
    model = SentencePairModel(RMCConfig(num_heads=2, head_size=8, fc_dim=16)).eval()
    path = tmp_path_factory.mktemp("parity") / "tiny.onnx"
    export_pair_model(model, path)
    return model, path, WordVectors.from_glove(special_vectors())


def _mismatched(model: SentencePairModel, change: Callable[[SentencePairModel], None]) -> SentencePairModel:
    """A copy of the model with one weight changed, so the exported graph no longer matches it."""
    changed = SentencePairModel(model.config).eval()
    changed.load_state_dict(model.state_dict())
    with torch.no_grad():
        change(changed)
    return changed


def test_the_graph_of_the_model_passes(exported):
    model, path, vectors = exported
    assert check_parity(model, path, vectors, PAIRS) < 1e-5
    assert path.exists()


def test_a_failed_check_names_the_output_and_pair_and_removes_the_graph(exported, tmp_path):
    model, path, vectors = exported
    graph = tmp_path / "tiny.onnx"
    graph.write_bytes(path.read_bytes())
    changed = _mismatched(model, lambda m: m.entailment_head[-1].bias[1].add_(0.01))  # logit 1 of every pair
    where = r"\(output entailment_logits, pair (\d), index \(\1, 1\)\); removed "
    with pytest.raises(SystemExit, match=FAILED + r"1\.00e-02 > 0\.0001 " + where):
        check_parity(changed, graph, vectors, PAIRS)
    assert not graph.exists()


def test_a_nan_output_fails_the_check(exported, tmp_path):
    model, path, vectors = exported
    graph = tmp_path / "tiny.onnx"
    graph.write_bytes(path.read_bytes())
    changed = _mismatched(model, lambda m: m.relatedness_head[-1].bias[0].fill_(np.nan))
    with pytest.raises(SystemExit, match=FAILED + r"inf > 0\.0001 \(output relatedness_log_probs, pair 0,"):
        check_parity(changed, graph, vectors, PAIRS)
    assert not graph.exists()
