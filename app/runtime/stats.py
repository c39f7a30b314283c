"""One model's inference statistics in the shape of Triton's statistics extension, counted by its batcher: requests
(a 429 at admission is a failure), queue waits, and each run's rows and phases."""

from __future__ import annotations

import time
from copy import deepcopy
from typing import Any

PHASES = ("compute_input", "compute_infer", "compute_output")  # collating the inputs, the run, splitting the outputs
Durations = dict[str, dict[str, int]]  # by name: a count and the cumulative nanoseconds of what it counts


def _phases(sums: list[int]) -> Durations:
    """The PHASES' durations of runs summed as [runs, then each phase's nanoseconds]."""
    return {phase: {"count": sums[0], "ns": ns} for phase, ns in zip(PHASES, sums[1:], strict=True)}


class ModelStats:
    """Counters, all updated and read on the event loop."""

    def __init__(self) -> None:
        self.inference: Durations = {name: {"count": 0, "ns": 0} for name in ("success", "fail", "queue")}
        self._runs: dict[int, list[int]] = {}  # by batch size: runs, then each phase's nanoseconds (see `_phases`)
        self.inference_count = self.execution_count = 0
        self.last_inference_ms = 0  # Unix time of the last execution, in milliseconds (0: none yet)

    def add(self, name: str, seconds: float) -> None:
        """A request done (`success` or `fail`, from its arrival) or a queue item's wait (`queue`)."""
        self.inference[name]["count"] += 1
        self.inference[name]["ns"] += int(seconds * 1e9)

    def executed(self, rows: int, *phase_seconds: float) -> None:
        """A run of `rows` rows and the seconds of each of its PHASES."""
        self.execution_count += 1
        self.inference_count += rows
        self.last_inference_ms = int(time.time() * 1000)
        sums = self._runs.setdefault(rows, [0, 0, 0, 0])
        sums[0] += 1
        for phase, seconds in enumerate(phase_seconds, 1):
            sums[phase] += int(seconds * 1e9)

    def snapshot(self) -> dict[str, Any]:
        """The counters in the statistics extension's shape (less the model's name and version)."""
        totals = [sum(column) for column in zip(*self._runs.values(), strict=True)] or [0, 0, 0, 0]
        return {
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": deepcopy(self.inference) | _phases(totals),
            "batch_stats": [{"batch_size": size, **_phases(sums)} for size, sums in sorted(self._runs.items())],
        }
