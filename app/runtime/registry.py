"""The model registry: each manifest entry verified, opened, warmed and prepared by its task; then served."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import timeit
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import numpy as np
import onnxruntime as ort
from tritonclient.utils import triton_to_np_dtype

from app.core.errors import ModelNotReady, UnknownModel, printable
from app.core.integrity import load_npy
from app.core.manifest import ModelLoadError, chosen, read_manifest, verified
from app.core.metrics import Metrics
from app.core.settings import Settings, split_list, usable_cpus
from app.runtime.batcher import BatchConfig, ModelBatcher
from app.runtime.instances import CPU, RunSlots, session_instance
from app.runtime.memory import trim_when_idle
from app.runtime.model import GraphLayout, ServedModel, Task, onnx_spec
from app.runtime.sessions import ProviderUnavailable, open_session, resolve_providers

logger = logging.getLogger("mnemo.registry")
SEED_RUNS = ((1, 16), (8, 16), (1, 64))  # (rows, length) of the warm-up runs that seed each instance's cost model


def _warm_up_feeds(session: ort.InferenceSession, rows: int, length: int) -> dict[str, np.ndarray]:
    """Each graph input, dynamic dims `rows` (the first) and `length`: integers (and booleans) 1, floats 0."""
    feeds = {}
    for node in session.get_inputs():
        spec = onnx_spec(node)
        if (dtype := triton_to_np_dtype(spec.datatype)) is np.object_:
            raise ModelLoadError(f"input {node.name} has type {node.type}, which warm-up cannot fill")
        shape = [(length if axis else rows) if dim < 0 else dim for axis, dim in enumerate(spec.shape)]
        feeds[node.name] = np.full(shape, 0 if np.issubdtype(dtype, np.floating) else 1, dtype=dtype)
    return feeds


def _sequences(nodes: list[ort.NodeArg]) -> tuple[str, ...]:
    """The inputs padded along axis 1 in a batch, or the outputs trimmed back: those whose axis 1 is symbolic (T)."""
    return tuple(node.name for node in nodes if len(node.shape) > 1 and not isinstance(node.shape[1], int))


class ModelRegistry:
    """Loads every model of the manifest at startup and hands them to the transports."""

    def __init__(self, settings: Settings, tasks: Mapping[str, Task], metrics: Metrics) -> None:
        self.settings, self.tasks, self.metrics = settings, dict(tasks), metrics
        self.models: dict[str, ServedModel] = {}
        self.providers: list[str] = []  # the onnxruntime provider of each instance

    def load(self) -> None:
        """Verify, open, warm and prepare every model (in parallel); raise or mark not ready per `on_model_error`."""
        self.providers = resolve_providers(self.settings.provider)
        entries = chosen(read_manifest(self.settings.artifacts_dir, set(self.tasks)), split_list(self.settings.models))
        self.models = {entry.name: ServedModel(entry) for entry in entries}
        with ThreadPoolExecutor(max(1, min(len(self.models), usable_cpus())), thread_name_prefix="model-load") as pool:
            list(pool.map(self._load_model, self.models.values()))
        for model in self.models.values():
            self.metrics.model_ready.labels(model.name).set(1 if model.ready else 0)
            if model.error and self.settings.on_model_error == "exit":
                raise ModelLoadError(f"model {model.name}: {model.error}")
            if model.error:
                logger.error("model %s is not served: %s", model.name, model.error)

    def _load_model(self, model: ServedModel) -> None:
        """Load one model's assets, sessions (its extra graphs' too) and state; a problem: its one-line `error`."""
        started, entry = time.perf_counter(), model.entry
        try:
            for key, asset in entry.assets.items():
                try:
                    model.assets[key] = load_npy(verified(self.settings.artifacts_dir, asset, f"asset {key}"))
                except ValueError as error:
                    raise ModelLoadError(f"asset {key} {asset.file} is not an .npy array: {error}") from None
            self._open(model)
            used = self.tasks[model.task].graphs
            for key, graph in entry.graphs.items():
                if key not in used:
                    known = ", ".join(sorted(used)) or "none"
                    raise ModelLoadError(f"graph {key!r} is not one that task {model.task} uses (it uses: {known})")
                update = {"name": f"{entry.name}.{key}", "file": graph.file, "sha256": graph.sha256, "graphs": {}}
                model.graphs[key] = part = ServedModel(entry.model_copy(update=update))
                self._open(part)
            model.state = self.tasks[model.task].prepare(model)
        except ProviderUnavailable as error:  # never one model's problem: the service would run on the wrong provider
            raise ModelLoadError(str(error)) from None
        except Exception as error:
            model.instances, model.session = [], None
            message = " ".join(str(error).split()).replace(f"{self.settings.artifacts_dir.resolve()}{os.sep}", "")
            model.error = printable(message, None)  # manifest strings (files, keys) may hold controls
            return
        took = time.perf_counter() - started
        logger.info("loaded %s (%s) on %s in %.2fs", model.name, model.task, model.instances[0].provider, took)

    def _open(self, model: ServedModel) -> None:
        """Verify the model's file, open it once per provider listed, warm each session up with SEED_RUNS, teaching its
        cost model the faster of two runs of each (the first allocates; the models load in parallel)."""
        path = verified(self.settings.artifacts_dir, model.entry, "model file")
        for index, provider in enumerate(self.providers):
            session = open_session(path, self.settings, provider)
            name = f"{provider.removesuffix('ExecutionProvider').lower()}-{index}"  # cpu-0, cuda-1, tensorrt-0
            model.instances.append(instance := session_instance(name, session, model.name, self.metrics))
            model.session = model.session or session
            sequences = bool(_sequences(session.get_inputs()))
            for rows, length in SEED_RUNS:
                length = length if sequences else 1
                run = partial(session.run, None, _warm_up_feeds(session, rows, length))
                instance.cost.observe(rows, length, min(timeit.repeat(run, repeat=2, number=1)))

    @contextlib.asynccontextmanager
    async def serve(self, alone: Callable[[], bool] = lambda: False) -> AsyncIterator[None]:
        """While the block runs (in the event loop): a batcher per graph of every ready model, and freed memory handed
        back when they idle; `alone()`: the server handles a single request (it may run inline)."""
        cpu_slots = RunSlots(self.settings.concurrent_runs or 1)  # every CPU instance's: the thread budget
        defaults = self.settings.model_dump(include={"max_batch", "max_wait_ms", "max_queue"})  # overridden per model
        defaults["deadline_s"], served = self.settings.request_timeout_s, []
        for model in filter(lambda model: model.ready, self.models.values()):
            limits = defaults | model.entry.batching.model_dump(exclude_none=True)
            config = BatchConfig(max_wait_s=limits.pop("max_wait_ms") / 1000, **limits)
            for graph in (model, *model.graphs.values()):
                for instance in graph.instances:
                    instance.slots = cpu_slots if instance.provider == CPU else RunSlots(1, f"onnx-{instance.name}")
                layout = GraphLayout(_sequences(graph.session.get_inputs()), _sequences(graph.session.get_outputs()))
                graph.batcher = ModelBatcher(graph.name, graph.instances, layout, config, self.metrics, alone)
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
                slots.executor.shutdown()  # its runs are over: the batchers waited for them

    def get(self, name: str | None, task: str) -> ServedModel:
        """The named model of `task`, or its default; 404 for unknown names, 503 when not ready."""
        model = None if name is None else self.models.get(name)
        if model is None or model.task != task:  # the named model is looked up directly, the others scanned
            candidates = [model for model in self.models.values() if model.task == task]
            if name is not None:
                known = ", ".join(sorted(m.name for m in candidates)) or "none"
                raise UnknownModel(f"Unknown {task} model {name[:100]!r}; available: {known}.")
            if not candidates:
                raise UnknownModel(f"No {task} model is configured on this server.")
            model = next((model for model in candidates if model.entry.default), candidates[0])
        if not model.ready:
            self.metrics.rejected.labels(model.name, "not_ready").inc()
            raise ModelNotReady(f"Model {model.name} is not ready: {model.error}")
        return model
