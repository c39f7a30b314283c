"""The runtime over a loaded registry: the run slots of the instances, one batcher per ready model, memory trimming."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from app.core.metrics import Metrics
from app.core.settings import Settings
from app.runtime.batcher import BatchConfig, ModelBatcher
from app.runtime.instances import RunSlots
from app.runtime.memory import release_free_memory
from app.runtime.model import GraphLayout, ServedModel, graph_layouts
from app.runtime.registry import ModelRegistry

TRIM_EVERY_S = 2.0  # how often an idle engine gives freed memory back


class Engine:
    """Starts (inside the event loop) and stops the batchers of every ready model and of its extra graphs, and trims
    memory when idle; `alone()`: the server handles a single request (the batchers may then run its rows inline)."""

    def __init__(
        self, registry: ModelRegistry, settings: Settings, metrics: Metrics, alone: Callable[[], bool] = lambda: False
    ) -> None:
        cpu_slots = RunSlots(settings.concurrent_runs or 1)  # every CPU instance's: the thread budget
        self._all_slots = [cpu_slots]  # and one per instance on another provider (a GPU runs one batch at once)
        self._served: list[ServedModel] = []
        for model in filter(lambda model: model.ready, registry.models.values()):
            task, override = registry.tasks[model.task], model.entry.batching  # settings, overridden per model
            config = BatchConfig(
                max_batch=override.max_batch or settings.max_batch,
                max_wait_s=(settings.max_wait_ms if override.max_wait_ms is None else override.max_wait_ms) / 1000,
                max_queue=override.max_queue or settings.max_queue,
                deadline_s=settings.request_timeout_s,
                max_cells=override.max_cells,
            )
            layouts = {None: GraphLayout(task.sequence_inputs, task.sequence_outputs), **graph_layouts(task)}
            for key, graph in ((None, model), *model.graphs.items()):
                for instance in graph.instances:
                    instance.slots = cpu_slots if instance.on_cpu else RunSlots(1, f"onnx-{instance.name}")
                    self._all_slots += [] if instance.on_cpu else [instance.slots]
                inputs, outputs = layouts[key].sequence_inputs, layouts[key].sequence_outputs
                graph.batcher = ModelBatcher(graph.name, graph.instances, inputs, outputs, config, metrics, alone)
                graph.batcher.start()
                self._served.append(graph)
        self._trimmer = asyncio.create_task(self._trim_when_idle(), name="memory-trim")

    async def _trim_when_idle(self) -> None:
        """After runs, once no model has work admitted, hand freed pages back to the system."""
        batchers, trimmed_at = [served.batcher for served in self._served], 0
        while True:
            await asyncio.sleep(TRIM_EVERY_S)
            runs = sum(batcher.runs_done for batcher in batchers)
            if runs != trimmed_at and not any(batcher.busy for batcher in batchers):
                await asyncio.to_thread(release_free_memory)
                trimmed_at = runs

    async def stop(self) -> None:
        self._trimmer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._trimmer
        for served in self._served:
            await served.batcher.stop()
            served.batcher = None
        for slots in self._all_slots:
            slots.close()
