"""The repeated-answer audit flags the rows of alternating two-skill blocks, and only those."""

from __future__ import annotations

import numpy as np

from export.kt_repeats import repeated_skill_pairs, skill_changes
from models.kt_data import Student, to_sequences


def test_alternating_two_skill_blocks_are_flagged_and_other_skill_changes_are_not():
    two_blocks = [7, 4, 5, 4, 5, 9, 9, 2, 3]
    three_blocks = [7, 4, 5, 4, 5, 4, 5, 9]
    data = to_sequences([Student(q, [1] * len(q)) for q in (two_blocks, three_blocks)], seqlen=12)
    flagged = repeated_skill_pairs(data)
    assert np.flatnonzero(flagged[0]).tolist() == [2, 4]  # the two 4->5 rows; 5->4 occurs once, 7->4, 9->2 once
    assert np.flatnonzero(flagged[1]).tolist() == [2, 3, 4, 5, 6]  # a run of three: 5->4 repeats too
    assert np.flatnonzero(skill_changes(data)[0]).tolist() == [1, 2, 3, 4, 5, 7, 8]  # never padding or row 0
