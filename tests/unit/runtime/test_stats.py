"""A model's statistics: the phases of all runs are the sums of those of each batch size."""

from __future__ import annotations

from app.runtime.batcher import ModelStats


def test_the_phases_of_all_runs_sum_those_of_each_batch_size():
    stats = ModelStats()
    assert stats.snapshot()["inference_stats"]["compute_infer"] == {"count": 0, "ns": 0}
    stats.executed(1, 0.001, 0.002, 0.003)
    stats.executed(1, 0.001, 0.002, 0.003)
    stats.executed(4, 0.0, 0.010, 0.0)
    stats.add("success", 0.5)
    snapshot = stats.snapshot()
    assert (snapshot["inference_count"], snapshot["execution_count"]) == (6, 3)
    assert snapshot["inference_stats"]["success"] == {"count": 1, "ns": 500_000_000}
    assert snapshot["inference_stats"]["compute_infer"] == {"count": 3, "ns": 14_000_000}
    assert snapshot["inference_stats"]["compute_output"] == {"count": 3, "ns": 6_000_000}
    assert [(batch["batch_size"], batch["compute_input"]) for batch in snapshot["batch_stats"]] == [
        (1, {"count": 2, "ns": 2_000_000}),
        (4, {"count": 1, "ns": 0}),
    ]
    assert list(snapshot["inference_stats"]) == [
        "success",
        "fail",
        "queue",
        "compute_input",
        "compute_infer",
        "compute_output",
    ]
