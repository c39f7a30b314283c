"""One model's inference statistics in the shape of Triton's statistics extension, counted by its batcher: requests
(a 429 at admission is a failure), queue waits, and each run's rows and phases."""

from __future__ import annotations

import threading
import time
from copy import deepcopy
from typing import Any

PHASES = ("compute_input", "compute_infer", "compute_output")  # collating the inputs, the run, splitting the outputs
Durations = dict[str, dict[str, int]]  # by name: a count and the cumulative nanoseconds of what it counts


def _durations(*names: str) -> Durations:
    return {name: {"count": 0, "ns": 0} for name in names}


def _add(durations: Durations, name: str, seconds: float) -> None:
    durations[name]["count"] += 1
    durations[name]["ns"] += int(seconds * 1e9)


class ModelStats:
    """Thread-safe counters: runs are counted on the run-slot threads, the rest on the event loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.inference = _durations("success", "fail", "queue", *PHASES)
        self.by_batch_size: dict[int, Durations] = {}
        self.inference_count = self.execution_count = 0
        self.last_inference_ms = 0  # Unix time of the last execution, in milliseconds (0: none yet)

    def add(self, name: str, seconds: float) -> None:
        """A request done (`success` or `fail`, from its arrival) or a queue item's wait (`queue`)."""
        with self._lock:
            _add(self.inference, name, seconds)

    def executed(self, rows: int, *phase_seconds: float) -> None:
        """A run of `rows` rows and the seconds of each of its PHASES."""
        with self._lock:
            self.execution_count += 1
            self.inference_count += rows
            self.last_inference_ms = int(time.time() * 1000)
            for durations in (self.inference, self.by_batch_size.setdefault(rows, _durations(*PHASES))):
                for phase, seconds in zip(PHASES, phase_seconds, strict=True):
                    _add(durations, phase, seconds)

    def snapshot(self) -> dict[str, Any]:
        """The counters in the statistics extension's shape (less the model's name and version)."""
        with self._lock:
            return {
                "last_inference": self.last_inference_ms,
                "inference_count": self.inference_count,
                "execution_count": self.execution_count,
                "inference_stats": deepcopy(self.inference),
                "batch_stats": [
                    {"batch_size": size, **deepcopy(by)} for size, by in sorted(self.by_batch_size.items())
                ],
            }
