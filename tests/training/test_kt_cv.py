"""The fold-spread card section: read from a real cross-validation run, finished or not, spliced idempotently."""

from __future__ import annotations

import shutil

import pytest

from export import kt as export_kt
from export import kt_cv
from models import cv_kt
from tests.synthetic_data import write_kt_students, write_synthetic_kt

CARD = "# card\n\n## Test metrics\n\nnumbers\n\n## Training\n\n- Command: x\n"


def test_fold_spread_section_reports_each_fold_and_survives_a_second_splice(tmp_path):
    data = write_synthetic_kt(tmp_path / "kt")
    write_kt_students(data / "synthetic" / "naive_c5_q50_s4000_v0_train.csv", 40, 50, 50, seed=5)
    run = tmp_path / "base-cv"
    args = ["--dataset", "synthetic-v0", "--data-dir", str(data), "--epochs", "2", "--no-progress"]
    cv = cv_kt.main(["--out", str(run), "--", *args])
    shutil.copytree(run, tmp_path / "other-cv")
    shutil.rmtree(tmp_path / "other-cv" / "fold5")
    (tmp_path / "other-cv" / "cv.json").unlink()  # an unfinished run has no cv.json: args come from a fold

    lines = kt_cv.section([run, tmp_path / "other-cv"])
    text = "\n".join(lines)
    assert all(f"{row['valid_auc']:.4f} (epoch {row['best_epoch']})" in text for row in cv["folds"])
    assert f"mean {cv['valid_auc_mean']:.4f}, sample std {cv['valid_auc_std']:.4f}" in text
    assert "| `other-cv` | 4 |" in text and "Only" not in text
    assert f"`python -m models.cv_kt --out {tmp_path / 'other-cv'} -- {' '.join(args)}`" in text

    card = kt_cv.splice(CARD, lines)
    assert card.index(kt_cv.BEGIN) < card.index("## Training") and card.startswith(CARD.split("## Training")[0])
    assert kt_cv.splice(card, lines) == card
    partial = kt_cv.section([tmp_path / "other-cv"])
    assert "Only 4 of the 5 folds finished" in kt_cv.splice(card, partial)
    assert kt_cv.section([tmp_path / "missing-cv"]) == []


@pytest.mark.slow
def test_exported_card_carries_the_fold_spread_of_its_recipe(tmp_path):
    data = write_synthetic_kt(tmp_path / "kt")
    write_kt_students(data / "synthetic" / "naive_c5_q50_s4000_v0_train.csv", 40, 50, 50, seed=5)
    run = tmp_path / "cv"
    cv = cv_kt.main(["--out", str(run), "--", "--dataset", "synthetic-v0", "--data-dir", str(data), "--epochs", "2"])
    artifacts = tmp_path / "artifacts"
    export_kt.main(
        ["--run", str(run / "fold1"), "--name", "kt-toy", "--artifacts", str(artifacts), "--cv-dir", str(run)]
    )
    card = (artifacts / "kt-toy.md").read_text()
    assert card.count(kt_cv.BEGIN) == 1 and f"mean {cv['valid_auc_mean']:.4f}" in card
    assert kt_cv.splice(card, kt_cv.section([run])) == card
