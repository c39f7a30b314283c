"""The served models' cards say what saw the test split and how to rebuild each model, and the rebuild runs.

The Reproduce block of every card is the one `export.reproduce` generates from `models/recipes.py` and the
manifest's version, so a card cannot quote another command than `make reproduce` runs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from app.core.settings import Settings
from app.main import create_app
from export import reproduce
from export.kt import validation_metrics
from models import recipes
from tests.synthetic_data import write_synthetic_kt

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"
SERVED = json.loads((ARTIFACTS / "manifest.json").read_text())["models"]


@pytest.fixture(scope="module")
def served() -> Iterator[TestClient]:
    with TestClient(create_app(Settings(provider="cpu", intra_op_threads=1, artifacts_dir=ARTIFACTS))) as client:
        yield client


@pytest.fixture(scope="module")
def listed(served: TestClient) -> dict[str, dict]:
    return {model["name"]: model for model in served.get("/models").json()["models"]}


def test_every_served_model_has_a_recipe_and_every_recipe_a_served_model():
    assert set(recipes.SERVED) == {entry["name"] for entry in SERVED}


@pytest.mark.parametrize("entry", SERVED, ids=lambda entry: entry["name"])
def test_card_says_what_saw_the_test_split_and_quotes_the_commands_make_reproduce_runs(entry):
    card = (ARTIFACTS / entry["card"]).read_text()
    assert "\n## What saw the test split\n" in card and "\n## Reproduce\n" in card
    block = "\n".join(reproduce.card_section(entry["name"], entry["version"]))
    assert block in card  # after a version bump: python -m export.reproduce <name> --card
    assert card.index("## What saw the test split") < card.index("## Reproduce") < card.index("## Training")


def test_get_models_and_the_metrics_carry_the_versions_and_the_assist2009_caveat_of_both_models(served, listed):
    assert {name: model["version"] for name, model in listed.items()} == {e["name"]: e["version"] for e in SERVED}
    families = text_string_to_metric_families(served.get("/metrics").text)
    info = next(family for family in families if family.name == "mnemo_model_info")
    assert sorted((s.labels["model"], s.labels["version"], s.labels["sha256"]) for s in info.samples) == sorted(
        (entry["name"], entry["version"], entry["sha256"]) for entry in SERVED
    )
    for name in ("dkvmn-assist2009", "dkt-assist2009"):
        metrics = listed[name]["metrics"]
        assert 0.5 < metrics["test_auc_without_repeated_skill_pairs"] < metrics["test_auc"]


def test_valid_auc_is_fold_one_and_the_cross_validation_has_its_own_names():
    run = {"fold": 1, "valid": {"auc": 0.81234}}
    assert validation_metrics(run) == {"valid_auc": 0.8123}
    assert validation_metrics({**run, "fold": 3}) == {}  # not fold 1: no valid_auc rather than another meaning
    folds = [{"fold": k, "valid_auc": 0.80 + k / 100, "best_epoch": 9} for k in (1, 2, 3)]
    cv = {"folds": folds, "valid_auc_mean": 0.82, "valid_auc_std": 0.01}
    assert validation_metrics({"fold": 3, "valid": {"auc": 0.83}, "cv": cv}) == {
        "valid_auc": 0.81,
        "valid_auc_cv_mean": 0.82,
        "valid_auc_cv_std": 0.01,
    }


def test_make_train_kt_and_train_sim_default_to_the_served_recipes():
    seed = ("--seed", "1024")
    assert recipes.train_kt_arguments("synthetic-v7") == (
        "--optimizer",
        "sgd",
        "--epochs",
        "100",
        "--refit-full",
        *seed,
    )
    assert recipes.train_kt_arguments("assist2009") == ("--refit-full", *seed)
    assert recipes.train_kt_arguments("assist2015") == seed
    assert recipes.train_kt_arguments("statics")[:2] == ("--memory-size", "10")
    with pytest.raises(SystemExit, match="no served recipe"):
        recipes.train_kt_arguments("assist2017")
    member = recipes.sim_member_arguments("vlmp", 104, 35)
    assert member[:2] == ("--pointer", "vlmp") and member[-4:] == ("--max-minutes", "35", "--seed", "104")
    assert "--average-from" in member and member[member.index("--fc-dim") + 1] == "128"


def test_the_served_model_against_itself_reads_identical(capsys):
    entry = next(e for e in SERVED if e["name"] == "dkvmn-assist2009")
    rows = reproduce.compare(entry, entry, ARTIFACTS, ARTIFACTS)
    assert all(row.endswith("+0.0000") for row in rows[1 : 1 + len(entry["metrics"])])
    assert "ONNX bytes: the same" in rows[-5] and rows[-4] == "ONNX weights: identical"
    assert rows[-3:] == [f"asset {key} ({a['file']}): the same bytes" for key, a in entry["assets"].items()]


def test_an_export_of_a_run_without_its_refit_is_stopped_with_the_fold_that_has_it(tmp_path):
    for fold, refit in ((3, None), (4, {"epochs": 10})):
        (tmp_path / f"fold{fold}").mkdir()
        (tmp_path / f"fold{fold}" / "result.json").write_text(json.dumps({"refit": refit}))
    train = [recipes.Command("models.cv_kt", ("--refit",))]
    export = recipes.Command("export.kt", ("--run", "{runs}/fold3"))
    with pytest.raises(SystemExit, match=r"fold3 holds no refit \(the refit is in .*fold4\)"):
        reproduce.check_refit(export, train, {"runs": str(tmp_path)})


def test_make_reproduce_rebuilds_into_a_scratch_folder_and_sets_the_metrics_beside_the_card(tmp_path, monkeypatch):
    """The whole dkvmn-synthetic recipe on a small generated data set: every step runs in its own process."""
    data = write_synthetic_kt(tmp_path / "data" / "kt")
    stem = data / "synthetic" / "naive_c5_q50_s4000_v0"
    full = Path(f"{stem}_train1.csv").read_text() + Path(f"{stem}_valid1.csv").read_text()
    Path(f"{stem}_train.csv").write_text(full)  # the whole training split the refit reads
    monkeypatch.chdir(ROOT)
    before = sorted(path.stat().st_mtime_ns for path in ARTIFACTS.iterdir())
    out = tmp_path / "reproduce"
    rows = reproduce.main(["dkvmn-synthetic", "--out", str(out), "--data-dir", str(tmp_path / "data")])
    assert rows[0].split() == ["metric", "card", "reproduced", "difference"]
    assert any(row.split()[0] == "test_auc" and row.split()[1] == "0.8297" for row in rows)
    rebuilt = json.loads((out / "artifacts" / "manifest.json").read_text())["models"][0]
    assert (rebuilt["name"], rebuilt["version"]) == (
        "dkvmn-synthetic",
        reproduce.entry(ARTIFACTS, "dkvmn-synthetic")["version"],
    )
    assert sorted(path.stat().st_mtime_ns for path in ARTIFACTS.iterdir()) == before  # the served files untouched
    shutil.rmtree(out)


def test_a_scratch_folder_that_is_the_served_artifacts_is_refused(tmp_path):
    with pytest.raises(SystemExit):
        reproduce.main(["dkvmn-synthetic", "--out", str(ROOT), "--served", str(ARTIFACTS.parent / "artifacts")])


@pytest.mark.skipif(
    shutil.which("make") is None or not (ROOT / ".venv" / "bin" / "python").exists(), reason="needs make and .venv"
)
def test_the_make_targets_run_the_served_recipes_unless_told_otherwise():
    def dry_run(*arguments: str) -> str:
        return subprocess.run(
            ["make", "-n", "-C", str(ROOT), *arguments], capture_output=True, text=True, check=True
        ).stdout

    served = dry_run("train-kt", "DATASET=synthetic-v3")
    assert "--dataset synthetic-v3" in served and "--optimizer sgd --epochs 100 --refit-full --seed 1024" in served
    assert "--optimizer" not in dry_run("train-kt", "DATASET=synthetic-v3", "RECIPE=")
    member = dry_run("train-sim", "POINTER=flmp", "SEED=102")
    assert "--out runs/sim/flmp-s102" in member and "--pointer flmp --fc-dim 128" in member
    assert "--max-minutes 35 --seed 102" in member
    assert "python -m export.reproduce dkvmn-statics" in dry_run("reproduce", "MODEL=dkvmn-statics")
