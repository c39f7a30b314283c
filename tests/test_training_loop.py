"""The shared epoch loop: a run interrupted and resumed ends exactly where an uninterrupted run ends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from models import train_kt, train_sim
from tests.synthetic_data import write_sick, write_synthetic_kt


def _final_weights(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "last.pt", weights_only=False)["model"]


def _assert_same_run(resumed: Path, straight: Path) -> None:
    for name, tensor in _final_weights(straight).items():
        torch.testing.assert_close(_final_weights(resumed)[name], tensor, rtol=0, atol=0)
    history = [json.loads((run / "result.json").read_text())["history"] for run in (resumed, straight)]
    assert [row["train_loss"] for row in history[0]] == [row["train_loss"] for row in history[1]]


def test_knowledge_tracing_run_resumes_exactly(tmp_path):
    data = write_synthetic_kt(tmp_path / "kt")
    common = ["--dataset", "synthetic-v0", "--data-dir", str(data), "--no-progress", "--patience", "9"]
    train_kt.main([*common, "--epochs", "3", "--out", str(tmp_path / "straight")])
    train_kt.main([*common, "--epochs", "1", "--out", str(tmp_path / "resumed")])
    train_kt.main([*common, "--epochs", "3", "--out", str(tmp_path / "resumed"), "--resume"])
    _assert_same_run(tmp_path / "resumed", tmp_path / "straight")


@pytest.mark.parametrize("swap", ["0", "0.5"])
def test_similarity_run_resumes_exactly_dropout_included(tmp_path, swap):
    data = write_sick(tmp_path / "sick")
    tiny = ["--heads", "2", "--head-size", "8", "--fc-dim", "16", "--no-progress", "--data-dir", str(data)]
    common = ["--pointer", "vlmp", *tiny, "--patience", "9", "--swap-relatedness", swap]
    train_sim.main([*common, "--epochs", "2", "--out", str(tmp_path / "straight")])
    train_sim.main([*common, "--epochs", "1", "--out", str(tmp_path / "resumed")])
    train_sim.main([*common, "--epochs", "2", "--out", str(tmp_path / "resumed"), "--resume"])
    _assert_same_run(tmp_path / "resumed", tmp_path / "straight")
