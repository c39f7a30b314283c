"""The instances of a model (one session each, on one provider) and the run slots they run on.

`MNEMO_PROVIDER` lists one provider per instance (`cuda,cpu`). Every CPU instance of every model shares one
`RunSlots` of `MNEMO_CONCURRENT_RUNS` threads (the thread budget); any other instance has one slot of its own, as
a GPU runs one batch of a session at a time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import onnxruntime as ort

from app.runtime.collate import Feeds
from app.runtime.cost import CostModel
from app.runtime.oom import BatchSplitter

CPU = "CPUExecutionProvider"
RunGraph = Callable[[Feeds], Feeds]


class RunSlots:
    """At most `runs` ONNX runs at once, each on its own executor thread, and the predicted end of each."""

    def __init__(self, runs: int, name: str = "onnx-run") -> None:
        self.runs = runs
        self.semaphore = asyncio.Semaphore(runs)
        self.taken = 0  # slots acquired and not yet released (asyncio.Semaphore does not say)
        self.executor = ThreadPoolExecutor(max_workers=runs, thread_name_prefix=name)
        self.ends: list[float] = []  # predicted end of each run in progress (the clock of its batcher)

    @property
    def free(self) -> int:
        """Run slots not taken right now."""
        return self.runs - self.taken

    async def acquire(self) -> None:
        await self.semaphore.acquire()
        self.taken += 1

    def release(self) -> None:
        self.taken -= 1
        self.semaphore.release()

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
    memory: BatchSplitter = field(default_factory=BatchSplitter)  # splits the batches its device cannot hold

    @property
    def row_limit(self) -> int | None:
        """`max_rows`, lowered to what the device was seen to hold once a batch ran out of its memory."""
        return min((limit for limit in (self.max_rows, self.memory.max_rows) if limit), default=None)

    @property
    def on_cpu(self) -> bool:
        return self.provider == CPU

    def public_info(self) -> dict:
        return {"name": self.name, "provider": self.provider, "max_rows": self.row_limit, "cost": self.cost.describe()}


def session_instance(
    name: str,
    session: ort.InferenceSession,
    model: str,
    observe: Callable[[float], None] = lambda seconds: None,
    on_split: Callable[[], None] = lambda: None,
) -> Instance:
    """An instance that runs `session`: each run timed by `observe` (mnemo_inference_duration_seconds), a batch
    its device cannot hold split in halves (`on_split` counts it)."""
    output_names = [output.name for output in session.get_outputs()]
    memory = BatchSplitter(on_split)

    def run_graph(feeds: Feeds) -> Feeds:
        return dict(zip(output_names, session.run(output_names, feeds), strict=True))

    def run(feeds: Feeds) -> Feeds:
        started = time.perf_counter()
        outputs = memory.run(run_graph, feeds, model)
        observe(time.perf_counter() - started)
        return outputs

    return Instance(name, session.get_providers()[0], run, session=session, memory=memory)
