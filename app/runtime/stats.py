"""One model's inference statistics, counted by its batcher: what Triton's statistics extension reports.

Requests: admitted ones that succeeded or failed (a refusal at admission, 429, is a failure too), each with its
duration from arrival. Queue: each queue item's wait from submission to the start of its run. Executions: each
ONNX run (`execution_count`), the rows it computed (`inference_count`), and the time spent collating its inputs,
running the graph and splitting its outputs (`PHASES`), also per batch size. The counters belong to this process:
with several workers, each reports its own.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

PHASES = ("compute_input", "compute_infer", "compute_output")


@dataclass
class Duration:
    """A count and the cumulative nanoseconds of what it counts."""

    count: int = 0
    ns: int = 0

    def add(self, seconds: float) -> None:
        self.count += 1
        self.ns += int(seconds * 1e9)


def _phases() -> dict[str, Duration]:
    return {phase: Duration() for phase in PHASES}


class ModelStats:
    """Thread-safe counters: executions are recorded on the run-slot threads, requests on the event loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.success, self.fail, self.queue = Duration(), Duration(), Duration()
        self.compute = _phases()
        self.by_batch_size: dict[int, dict[str, Duration]] = {}
        self.inference_count = self.execution_count = 0
        self.last_inference_ms = 0  # Unix time of the last execution, in milliseconds (0: none yet)

    def request_done(self, seconds: float, succeeded: bool) -> None:
        with self._lock:
            (self.success if succeeded else self.fail).add(seconds)

    def waited(self, seconds: float) -> None:
        with self._lock:
            self.queue.add(seconds)

    def executed(self, rows: int, *phase_seconds: float) -> None:
        """A run of `rows` rows and the seconds of each of its PHASES."""
        with self._lock:
            self.execution_count += 1
            self.inference_count += rows
            self.last_inference_ms = int(time.time() * 1000)
            for phases in (self.compute, self.by_batch_size.setdefault(rows, _phases())):
                for phase, seconds in zip(PHASES, phase_seconds, strict=True):
                    phases[phase].add(seconds)

    def snapshot(self) -> dict[str, Any]:
        """The counters in the statistics extension's shape (less the model's name and version)."""
        with self._lock:
            return {
                "last_inference": self.last_inference_ms,
                "inference_count": self.inference_count,
                "execution_count": self.execution_count,
                "inference_stats": _as_dicts(
                    {"success": self.success, "fail": self.fail, "queue": self.queue, **self.compute}
                ),
                "batch_stats": [
                    {"batch_size": size, **_as_dicts(phases)} for size, phases in sorted(self.by_batch_size.items())
                ],
            }


def _as_dicts(durations: dict[str, Duration]) -> dict[str, dict[str, int]]:
    return {name: {"count": duration.count, "ns": duration.ns} for name, duration in durations.items()}
