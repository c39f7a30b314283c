"""The shared epoch loop: a run interrupted and resumed ends exactly where an uninterrupted run ends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from models import train_kt, train_sim
from models.epoch_loop import WeightAverage
from tests.synthetic_data import write_kt_students, write_sick, write_synthetic_kt

pytestmark = pytest.mark.slow  # each test starts a server, a browser or a training run: seconds (-m "not slow")


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


def test_weight_average_is_the_mean_of_the_snapshots():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    average, snapshots = WeightAverage(), []
    for epoch in (5, 6, 7):
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.normal_()
        snapshots.append({name: tensor.clone() for name, tensor in model.state_dict().items()})
        average.add(model, epoch)
    mean = average.weights(model.state_dict())
    for name, tensor in mean.items():
        expected = torch.stack([snapshot[name].double() for snapshot in snapshots]).mean(0).float()
        torch.testing.assert_close(tensor, expected, rtol=0, atol=1e-7)
        assert tensor.dtype == torch.float32
    assert (average.first_epoch, average.last_epoch, average.count) == (5, 7, 3)


def _sim_args(data: Path) -> list[str]:
    tiny = ["--heads", "2", "--head-size", "8", "--fc-dim", "16", "--no-progress", "--data-dir", str(data)]
    return ["--pointer", "vlmp", *tiny, "--patience", "9"]


def test_averaged_run_resumes_exactly_and_selects_among_raw_and_average(tmp_path):
    common = [*_sim_args(write_sick(tmp_path / "sick")), "--average-from", "2"]
    straight = train_sim.main([*common, "--epochs", "3", "--out", str(tmp_path / "straight")])
    train_sim.main([*common, "--epochs", "2", "--out", str(tmp_path / "resumed")])
    resumed = train_sim.main([*common, "--epochs", "3", "--out", str(tmp_path / "resumed"), "--resume"])
    _assert_same_run(tmp_path / "resumed", tmp_path / "straight")
    assert resumed["history"] == straight["history"]
    assert [("trial_average_pearson" in row) for row in straight["history"]] == [False, True, True]
    best = torch.load(tmp_path / "straight" / "best.pt", weights_only=False)
    if straight["best_weights"] == "average":
        assert best["averaged_epochs"] == straight["best_averaged_epochs"] == [2, straight["best_epoch"]]
    else:
        assert "averaged_epochs" not in best and straight["best_averaged_epochs"] is None
    # the averaged model after epoch 3 is the mean of the raw weights after epochs 2 and 3
    last = torch.load(tmp_path / "straight" / "last.pt", weights_only=False)
    assert last["average"]["count"] == 2


def test_resume_with_another_averaging_start_is_refused(tmp_path):
    common = _sim_args(write_sick(tmp_path / "sick"))
    train_sim.main([*common, "--epochs", "1", "--out", str(tmp_path / "run")])
    with pytest.raises(SystemExit, match="weight averaging from epoch 0"):
        train_sim.main([*common, "--epochs", "2", "--average-from", "1", "--out", str(tmp_path / "run"), "--resume"])


def _kt_refit(data: Path, out: Path, state: dict) -> dict[str, torch.Tensor]:
    """The weights `train_kt`'s refit ships for a selection state (the refit is seeded, so it is repeatable)."""
    args = train_kt.build_parser().parse_args(["--dataset", "synthetic-v0", "--data-dir", str(data), "--no-progress"])
    args.refit_full = True
    recipe = train_kt.recipe_for(args.dataset)
    _, splits = train_kt.load_splits(args, recipe)
    config = train_kt.model_config(args, recipe)
    model, _ = train_kt.refit_on_full_train(args, recipe, config, state, splits["full"], out)
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


def test_knowledge_tracing_refit_averages_the_selected_epochs(tmp_path):
    data = write_synthetic_kt(tmp_path / "kt")
    write_kt_students(data / "synthetic" / "naive_c5_q50_s4000_v0_train.csv", 40, 50, 50, seed=5)
    history = [{"lr": 0.05}, {"lr": 0.03}, {"lr": 0.02}]
    raw = [_kt_refit(data, tmp_path / f"raw{n}", {"history": history, "best_epoch": n}) for n in (2, 3)]
    selected = {"history": history, "best_epoch": 3, "best_weights": "average", "best_averaged_epochs": [2, 3]}
    averaged = _kt_refit(data, tmp_path / "average", selected)
    for name, tensor in averaged.items():
        torch.testing.assert_close(tensor, (raw[0][name] + raw[1][name]) / 2, rtol=0, atol=1e-6)
    assert torch.load(tmp_path / "average" / "final.pt", weights_only=False)["averaged_epochs"] == [2, 3]

    common = ["--dataset", "synthetic-v0", "--data-dir", str(data), "--no-progress", "--average-from", "2"]
    result = train_kt.main([*common, "--epochs", "3", "--out", str(tmp_path / "run"), "--refit-full"])
    assert result["average_from"] == 2 and [("valid_average_auc" in row) for row in result["history"]] == [0, 1, 1]
    expected = result["best_averaged_epochs"] if result["best_weights"] == "average" else None
    assert result["refit"]["epochs"] == result["best_epoch"] and result["refit"]["averaged_epochs"] == expected
    with pytest.raises(SystemExit, match="weight averaging from epoch 2"):
        train_kt.main([*common[:-1], "3", "--epochs", "3", "--out", str(tmp_path / "run"), "--resume"])


def test_knowledge_tracing_init_std_flag_sets_the_model_config():
    recipe = train_kt.recipe_for("synthetic-v0")
    parse = train_kt.build_parser().parse_args
    assert train_kt.model_config(parse(["--dataset", "synthetic-v0"]), recipe).init_std == 0.1
    config = train_kt.model_config(parse(["--dataset", "synthetic-v0", "--init-std", "0.3"]), recipe)
    assert config.init_std == 0.3
    assert train_kt.build_model(config).qa_embed.weight.std().item() > 0.25
