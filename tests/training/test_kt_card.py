"""The DKVMN model card says which weights a run with weight averaging shipped, and how long it took on how many
threads."""

from __future__ import annotations

import pytest

from export import cards
from export import kt as export_kt
from models import train_kt
from tests.synthetic_data import write_synthetic_kt

pytestmark = pytest.mark.slow  # each test starts a server, a browser or a training run: seconds (-m "not slow")


def test_exported_card_says_which_weights_selection_took(tmp_path, capsys):
    data = write_synthetic_kt(tmp_path / "kt")
    run = tmp_path / "runs" / "synthetic-v0"
    args = ["--dataset", "synthetic-v0", "--data-dir", str(data), "--epochs", "3", "--average-from", "2"]
    result = train_kt.main([*args, "--optimizer", "sgd", "--out", str(run), "--no-progress", "--threads", "2"])
    export_kt.main(["--run", str(run), "--name", "kt-toy", "--artifacts", str(tmp_path / "artifacts")])
    assert "had no manifest.json: starting a new one, which serves only this model" in capsys.readouterr().out
    card = (tmp_path / "artifacts" / "kt-toy.md").read_text()
    assert export_kt._average_lines(result)[0] in card.splitlines()
    assert f"wall time {result['wall_seconds']:.0f} s (2 CPU threads)." in card  # was "0.0 min (1 CPU thread)"


def test_training_time_and_threads_read_as_a_person_would_write_them():
    assert (cards.duration(4.4), cards.duration(119.4), cards.duration(5400)) == ("4 s", "119 s", "90.0 min")
    assert cards.cpu_threads({"threads": 1}) == "1 CPU thread"
    assert cards.cpu_threads({}, {"threads": 1}) == "1 CPU thread"  # runs recorded before the field: 1 thread
    assert cards.cpu_threads({"threads": 2}, {"threads": 2}) == "2 CPU threads"
    assert cards.cpu_threads({"threads": 1}, {"threads": 2}) == "1-2 CPU threads"


def test_average_line_names_the_averaged_epochs_the_raw_epoch_or_nothing():
    run = {"average_from": 20, "best_epoch": 49, "best_weights": "average", "best_averaged_epochs": [20, 49]}
    (averaged,) = export_kt._average_lines({**run, "refit": {"epochs": 49}})
    assert "(`--average-from 20`)" in averaged and "the ends of epochs 20-49; the refit ships" in averaged
    (raw,) = export_kt._average_lines({**run, "best_weights": "raw", "best_averaged_epochs": None})
    assert raw.endswith("here the raw weights of epoch 49.")
    assert export_kt._average_lines({**run, "average_from": 0}) == []
