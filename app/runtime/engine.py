"""The runtime over a loaded registry: the run slots of the instances, one batcher per ready model, memory trimming."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from app.runtime.batcher import BatchConfig, ModelBatcher
from app.runtime.instances import RunSlots
from app.runtime.memory import trim_when_idle
from app.runtime.registry import ModelRegistry


@contextlib.asynccontextmanager
async def engine(registry: ModelRegistry, alone: Callable[[], bool] = lambda: False) -> AsyncIterator[None]:
    """While the block runs (inside the event loop): a batcher for every ready model and each of its extra graphs, and
    freed memory handed back when they idle; `alone()`: the server handles a single request (it may run inline)."""
    settings, served = registry.settings, []
    cpu_slots = RunSlots(settings.concurrent_runs or 1)  # every CPU instance's: the thread budget (a GPU has its own)
    defaults = settings.model_dump(include={"max_batch", "max_wait_ms", "max_queue"})  # overridden per model
    defaults["deadline_s"] = settings.request_timeout_s
    for model in filter(lambda model: model.ready, registry.models.values()):
        task, limits = registry.tasks[model.task], defaults | model.entry.batching.model_dump(exclude_none=True)
        config = BatchConfig(max_wait_s=limits.pop("max_wait_ms") / 1000, **limits)
        for key, graph in ((None, model), *model.graphs.items()):
            for instance in graph.instances:
                instance.slots = cpu_slots if instance.on_cpu else RunSlots(1, f"onnx-{instance.name}")
            layout = task.graphs[key] if key else task.layout
            graph.batcher = ModelBatcher(graph.name, graph.instances, layout, config, registry.metrics, alone)
            served.append(graph)
    trimmer = asyncio.create_task(trim_when_idle([graph.batcher for graph in served]), name="memory-trim")
    try:
        yield
    finally:
        trimmer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await trimmer
        for graph in served:
            await graph.batcher.stop()
            graph.batcher = None
        for slots in {cpu_slots, *(instance.slots for graph in served for instance in graph.instances)}:
            slots.close()
