"""The runtime over a loaded registry: the shared run slots and one batcher per ready model."""

from __future__ import annotations

from app.frame.metrics import Metrics
from app.frame.registry import ModelRegistry
from app.frame.settings import Settings
from app.runtime.batcher import BatchConfig, ModelBatcher, RunSlots


def batch_config(settings: Settings, model_entry) -> BatchConfig:
    """Settings, overridden per model by the manifest's `batching`."""
    override = model_entry.batching
    wait_ms = settings.max_wait_ms if override.max_wait_ms is None else override.max_wait_ms
    return BatchConfig(
        max_batch=override.max_batch or settings.max_batch,
        max_wait_s=wait_ms / 1000,
        max_queue=override.max_queue or settings.max_queue,
        deadline_s=settings.request_timeout_s,
    )


class Engine:
    """Starts (inside the event loop) and stops the batchers of every ready model."""

    def __init__(self, registry: ModelRegistry, settings: Settings, metrics: Metrics) -> None:
        self.registry = registry
        self.slots = RunSlots(settings.concurrent_runs or 1)
        for model in registry.models.values():
            if not model.ready:
                continue
            task = registry.tasks[model.task]
            model.batcher = ModelBatcher(
                model.name,
                model.run,
                task.sequence_inputs,
                task.sequence_outputs,
                self.slots,
                batch_config(settings, model.entry),
                metrics,
            )
            model.batcher.start()

    async def stop(self) -> None:
        for model in self.registry.models.values():
            if model.batcher is not None:
                await model.batcher.stop()
                model.batcher = None
        self.slots.close()
