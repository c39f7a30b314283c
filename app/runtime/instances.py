"""The instances of a model (one session each, on one provider) and the run slots they run on.

`MNEMO_PROVIDER` lists one provider per instance (`cuda,cpu`). Every CPU instance of every model shares one
`RunSlots` of `MNEMO_CONCURRENT_RUNS` threads (the thread budget); any other instance has one slot of its own, as
a GPU runs one batch of a session at a time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import onnxruntime as ort

from app.runtime.collate import Feeds
from app.runtime.cost import CostModel

CPU = "CPUExecutionProvider"
RunGraph = Callable[[Feeds], Feeds]


class RunSlots:
    """At most `runs` ONNX runs at once, each on its own executor thread, and the predicted end of each."""

    def __init__(self, runs: int, name: str = "onnx-run") -> None:
        self.runs = runs
        self.semaphore = asyncio.Semaphore(runs)
        self.executor = ThreadPoolExecutor(max_workers=runs, thread_name_prefix=name)
        self.ends: list[float] = []  # predicted end of each run in progress (the clock of its batcher)

    @property
    def free(self) -> int:
        """Run slots not taken right now."""
        return self.semaphore._value

    def free_at(self, now: float) -> float:
        """When a slot is predicted to be free: now if one is."""
        return now if self.free or not self.ends else max(now, min(self.ends))

    def close(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)


@dataclass(eq=False)
class Instance:
    """One session of a model: how to run it, where, and what its runs cost."""

    name: str  # unique within its model: its provider's short name and its place in MNEMO_PROVIDER (`cpu-1`)
    provider: str  # the onnxruntime provider
    run: RunGraph  # blocking: the batcher calls it on one of `slots`' threads
    slots: RunSlots | None = None  # set by the engine (app/runtime/engine.py)
    session: ort.InferenceSession | None = None
    cost: CostModel = field(default_factory=CostModel)
    max_rows: int | None = None  # rows per run this instance takes at most (its device's memory); None: no own limit

    @property
    def on_cpu(self) -> bool:
        return self.provider == CPU

    def public_info(self) -> dict:
        return {"name": self.name, "provider": self.provider, "max_rows": self.max_rows, "cost": self.cost.describe()}
