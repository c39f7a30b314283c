"""Five-fold cross-validation of a DKVMN recipe: folds partition the students; finished work is read back."""

from __future__ import annotations

from pathlib import Path

import pytest

from models import cv_kt
from models.kt_data import Student, cv_split
from tests.synthetic_data import write_kt_students, write_synthetic_kt


def test_derived_folds_hold_out_every_student_exactly_once():
    students = [Student([i + 1], [i % 2]) for i in range(23)]
    held_out = []
    for fold in range(1, 6):
        train, valid = cv_split(students, fold)
        assert len(train) + len(valid) == len(students) and not set(map(id, train)) & set(map(id, valid))
        held_out += valid
    assert sorted(map(id, held_out)) == sorted(map(id, students))


@pytest.mark.slow
def test_cross_validation_refits_the_median_fold_once(tmp_path):
    data = write_synthetic_kt(tmp_path / "kt")
    write_kt_students(data / "synthetic" / "naive_c5_q50_s4000_v0_train.csv", 40, 50, 50, seed=5)
    args = ["--out", str(tmp_path / "run"), "--refit", "--", "--dataset", "synthetic-v0"]
    args += ["--data-dir", str(data), "--epochs", "2", "--no-progress"]
    first = cv_kt.main(args)
    run = tmp_path / "run" / f"fold{first['fold']}"
    stamps = {path: path.stat().st_mtime_ns for path in (tmp_path / "run").rglob("*.pt")}
    second = cv_kt.main(args)
    assert {path: path.stat().st_mtime_ns for path in (tmp_path / "run").rglob("*.pt")} == stamps  # nothing retrained
    assert second["refit"] == first["refit"] and (run / "final.pt").exists()
    assert len(second["cv"]["folds"]) == 5 and second["command"].startswith("python -m models.cv_kt --out")
    assert second["best_epoch"] == second["cv"]["best_epoch_median"]
    assert Path(second["data_files"]["full"]["file"]).name == "naive_c5_q50_s4000_v0_train.csv"


@pytest.mark.slow
def test_a_fold_finished_with_another_recipe_is_refused_not_read_back(tmp_path):
    data = write_synthetic_kt(tmp_path / "kt")
    write_kt_students(data / "synthetic" / "naive_c5_q50_s4000_v0_train.csv", 40, 50, 50, seed=5)
    recipe = ["--dataset", "synthetic-v0", "--data-dir", str(data), "--no-progress"]
    cv_kt.main(["--out", str(tmp_path / "run"), "--", *recipe, "--epochs", "1"])
    with pytest.raises(SystemExit, match="give this recipe its own --out directory"):
        cv_kt.main(["--out", str(tmp_path / "run"), "--", *recipe, "--epochs", "2"])
    fold = "python -m models.train_kt --dataset x --fold 3 --out /r/fold3 --resume --epochs 2"
    refitted = "python -m models.cv_kt --out /r --refit -- --dataset x --epochs 2"
    assert cv_kt.recipe_of(fold) == cv_kt.recipe_of(refitted) == ["--dataset", "x", "--epochs", "2"]
    averaged = "python -m models.train_kt --dataset x --fold 3 --out /r/fold3 --resume --average-from 20"
    assert cv_kt.recipe_of(averaged) == ["--dataset", "x", "--average-from", "20"]  # averaging is part of the recipe
