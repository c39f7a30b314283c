"""The repeated-answer audit: which rows it flags, and the assist2009 card and manifest that report it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from export import kt as export_kt
from export.kt_repeats import repeated_skill_pairs, skill_changes
from models import train_kt
from models.kt_data import Student, to_sequences
from tests.synthetic_data import write_kt_students


def test_alternating_two_skill_blocks_are_flagged_and_other_skill_changes_are_not():
    two_blocks = [7, 4, 5, 4, 5, 9, 9, 2, 3]
    three_blocks = [7, 4, 5, 4, 5, 4, 5, 9]
    data = to_sequences([Student(q, [1] * len(q)) for q in (two_blocks, three_blocks)], seqlen=12)
    flagged = repeated_skill_pairs(data)
    assert np.flatnonzero(flagged[0]).tolist() == [2, 4]  # the two 4->5 rows; 5->4 occurs once, 7->4, 9->2 once
    assert np.flatnonzero(flagged[1]).tolist() == [2, 3, 4, 5, 6]  # a run of three: 5->4 repeats too
    assert np.flatnonzero(skill_changes(data)[0]).tolist() == [1, 2, 3, 4, 5, 7, 8]  # never padding or row 0


@pytest.mark.slow
def test_assist2009_export_writes_the_repeat_caveat_into_card_and_manifest(tmp_path):
    folder = tmp_path / "kt" / "assist2009_updated"
    for split, seed in (("train1", 0), ("valid1", 1)):
        write_kt_students(folder / f"assist2009_updated_{split}.csv", 12, 110, 30, seed)
    blocks = [("4,5,4,5,4,5,9,2,7,7", "1,1,0,0,1,1,0,1,0,1"), ("8,3,8,3,1,1,6", "0,0,1,1,1,0,1")]
    lines = [f"{len(q.split(','))}\n{q}\n{r}\n" for q, r in blocks * 3]
    (folder / "assist2009_updated_test.csv").write_text("".join(lines))
    (folder / "assist2009_updated_skill_mapping.txt").write_text("1\tCircumference\n2\tRounding\n")
    run, artifacts = tmp_path / "run", tmp_path / "artifacts"
    train_kt.main(["--dataset", "assist2009", "--data-dir", str(tmp_path / "kt"), "--epochs", "1", "--out", str(run)])
    export_kt.main(["--run", str(run), "--name", "dkvmn-assist2009", "--artifacts", str(artifacts)])
    assert (
        "## Evaluation caveat: answers repeated by multi-skill problems"
        in (artifacts / "dkvmn-assist2009.md").read_text()
    )
    metrics = json.loads((artifacts / "manifest.json").read_text())["models"][0]["metrics"]
    assert 0.0 <= metrics["test_auc_without_repeated_skill_pairs"] <= 1.0
