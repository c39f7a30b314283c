"""One model's inference statistics, counted by its batcher: what Triton's statistics extension reports.

Requests: admitted ones that succeeded or failed (a refusal at admission, 429, is a failure too), each with its
duration from arrival. Queue: each queue item's wait from submission to the start of its run. Executions: each
ONNX run (`execution_count`), the rows it computed (`inference_count`), and the time spent collating its inputs
(`compute_input`), running the graph (`compute_infer`) and splitting its outputs (`compute_output`), also per
batch size. The counters belong to this process: with several workers, each reports its own.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Duration:
    """A count and the cumulative nanoseconds of what it counts."""

    count: int = 0
    ns: int = 0

    def add(self, seconds: float) -> None:
        self.count += 1
        self.ns += int(seconds * 1e9)

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class Compute:
    """The three phases of an execution."""

    input: Duration = field(default_factory=Duration)
    infer: Duration = field(default_factory=Duration)
    output: Duration = field(default_factory=Duration)

    def add(self, input_s: float, infer_s: float, output_s: float) -> None:
        self.input.add(input_s)
        self.infer.add(infer_s)
        self.output.add(output_s)

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {
            "compute_input": self.input.as_dict(),
            "compute_infer": self.infer.as_dict(),
            "compute_output": self.output.as_dict(),
        }


class ModelStats:
    """Thread-safe counters: executions are recorded on the run-slot threads, requests on the event loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.success = Duration()
        self.fail = Duration()
        self.queue = Duration()
        self.compute = Compute()
        self.by_batch_size: dict[int, Compute] = {}
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0  # Unix time of the last execution, in milliseconds (0: none yet)

    def request_done(self, seconds: float, succeeded: bool) -> None:
        with self._lock:
            (self.success if succeeded else self.fail).add(seconds)

    def waited(self, seconds: float) -> None:
        with self._lock:
            self.queue.add(seconds)

    def executed(self, rows: int, input_s: float, infer_s: float, output_s: float) -> None:
        with self._lock:
            self.execution_count += 1
            self.inference_count += rows
            self.last_inference_ms = int(time.time() * 1000)
            self.compute.add(input_s, infer_s, output_s)
            self.by_batch_size.setdefault(rows, Compute()).add(input_s, infer_s, output_s)

    def snapshot(self) -> dict[str, Any]:
        """The counters in the statistics extension's shape (less the model's name and version)."""
        with self._lock:
            return {
                "last_inference": self.last_inference_ms,
                "inference_count": self.inference_count,
                "execution_count": self.execution_count,
                "inference_stats": {
                    "success": self.success.as_dict(),
                    "fail": self.fail.as_dict(),
                    "queue": self.queue.as_dict(),
                    **self.compute.as_dict(),
                },
                "batch_stats": [
                    {"batch_size": size, **compute.as_dict()} for size, compute in sorted(self.by_batch_size.items())
                ],
            }
