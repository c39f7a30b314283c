"""The verified model registry: manifest -> sha256 check -> ONNX Runtime session -> warm-up -> ready.

Routers reach it as `request.app.state.registry` and call `registry.get(name_or_None, task)`, which returns
a `ServedModel` (the named one, else the task's default, else its only/first model) or raises
`UnknownModel` (404 listing the names of that task) / `ModelNotReady` (503). `ServedModel.run(feeds)`
is blocking: call it through `starlette.concurrency.run_in_threadpool`.

Task preparers: `ModelRegistry(settings, preparers={task: prepare}, metrics)` calls
`prepare(model, settings) -> None` once for each loaded model of that task, after its session is
verified and warmed and before `/ready` turns 200. It may store what requests need in `model.state`; an
exception it raises is a model load error (exit, or not ready with MNEMO_ON_MODEL_ERROR=skip).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from app.errors import ModelNotReady, UnknownModel
from app.integrity import sha256_of
from app.metrics import Metrics
from app.providers import ProviderUnavailable, check_session_provider, resolve_provider, session_providers
from app.settings import Settings

logger = logging.getLogger("mnemo.registry")
TASKS = ("similarity", "knowledge-trace")
REQUIRED_FIELDS = ("name", "task", "version", "file", "sha256")
Preparer = Callable[["ServedModel", Settings], None]


class ModelLoadError(RuntimeError):
    """A model listed in the manifest cannot be served (missing, tampered, or broken)."""


@dataclass
class ServedModel:
    """One manifest entry and, once loaded, its session, assets and task state."""

    name: str
    task: str
    version: str
    file: Path
    sha256: str
    default: bool = False
    limits: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    card: str | None = None
    assets: dict[str, np.ndarray] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    provider: str | None = None
    error: str | None = None
    session: ort.InferenceSession | None = None
    output_names: list[str] = field(default_factory=list)
    observe_inference: Callable[[float], None] = lambda seconds: None

    @property
    def ready(self) -> bool:
        return self.session is not None and self.error is None

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the session (blocking; call from a worker thread) and record its time."""
        if self.session is None:
            raise ModelNotReady(f"Model {self.name} is not loaded: {self.error}")
        started = time.perf_counter()
        outputs = self.session.run(self.output_names, feeds)
        self.observe_inference(time.perf_counter() - started)
        return dict(zip(self.output_names, outputs, strict=True))

    def public_info(self) -> dict[str, Any]:
        """What GET /models reports."""
        info = {
            "name": self.name,
            "task": self.task,
            "version": self.version,
            "sha256": self.sha256,
            "provider": self.provider,
            "default": self.default,
            "ready": self.ready,
            "limits": self.limits,
            "metrics": self.metrics,
            "metadata": self.metadata,
            "card": self.card,
        }
        for key in ("n_questions", "n_concepts"):
            if key in self.metadata:
                info[key] = self.metadata[key]
        if "max_tokens" in self.limits:
            info["max_tokens"] = self.limits["max_tokens"]
        if self.error:
            info["error"] = self.error
        return info


def _parse_manifest(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        raise ModelLoadError(f"no manifest at {path} (set MNEMO_ARTIFACTS_DIR)")
    try:
        manifest = json.loads(path.read_text())
        entries = manifest["models"]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise ModelLoadError(f"{path} is not a valid manifest: {error}") from None
    for entry in entries:
        missing = [key for key in REQUIRED_FIELDS if key not in entry]
        if missing:
            raise ModelLoadError(f"{path}: entry {entry.get('name', '?')} lacks {', '.join(missing)}")
        if entry["task"] not in TASKS:
            raise ModelLoadError(f"{path}: model {entry['name']} has unknown task {entry['task']!r}")
    names = [entry["name"] for entry in entries]
    if len(set(names)) != len(names):
        raise ModelLoadError(f"{path}: model names must be unique")
    for task in TASKS:
        defaults = [entry["name"] for entry in entries if entry["task"] == task and entry.get("default")]
        if len(defaults) > 1:
            raise ModelLoadError(f"{path}: at most one default {task} model, not {', '.join(defaults)}")
    return entries


# ONNX tensor element types -> numpy dtypes, for the generic warm-up feeds.
WARM_UP_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int16)": np.int16,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


def _warm_up_feeds(session: ort.InferenceSession) -> dict[str, np.ndarray]:
    """One input of each graph input: dynamic dims 1, integers (and booleans) 1, floats 0."""
    feeds = {}
    for graph_input in session.get_inputs():
        shape = [dim if isinstance(dim, int) and dim > 0 else 1 for dim in graph_input.shape]
        dtype = WARM_UP_DTYPES.get(graph_input.type)
        if dtype is None:
            raise ModelLoadError(f"input {graph_input.name} has type {graph_input.type}, which warm-up cannot fill")
        fill = 0 if np.issubdtype(dtype, np.floating) else 1
        feeds[graph_input.name] = np.full(shape, fill, dtype=dtype)
    return feeds


class ModelRegistry:
    """Loads every model of the manifest at startup and hands them to the routers."""

    def __init__(self, settings: Settings, preparers: dict[str, Preparer], metrics: Metrics) -> None:
        self.settings = settings
        self.preparers = preparers
        self.metrics = metrics
        self.models: dict[str, ServedModel] = {}
        self.provider: str | None = None

    def load(self) -> None:
        """Verify, open, warm and prepare every model; raise or mark not ready per `on_model_error`."""
        self.provider = resolve_provider(self.settings.provider)
        artifacts = Path(self.settings.artifacts_dir)
        for entry in _parse_manifest(artifacts / "manifest.json"):
            model = ServedModel(
                name=entry["name"],
                task=entry["task"],
                version=entry["version"],
                file=artifacts / entry["file"],
                sha256=entry["sha256"],
                default=bool(entry.get("default", False)),
                limits=entry.get("limits", {}),
                metrics=entry.get("metrics", {}),
                metadata=entry.get("metadata", {}),
                card=entry.get("card"),
                observe_inference=self.metrics.inference.labels(entry["name"]).observe,
            )
            self.models[model.name] = model
            try:
                self._load_model(model, entry.get("assets", {}), artifacts)
            except ProviderUnavailable:
                raise  # never a per-model problem: the whole service would run on the wrong provider
            except Exception as error:
                model.session, model.error = None, str(error)
                if self.settings.on_model_error == "exit":
                    raise ModelLoadError(f"model {model.name}: {error}") from error
                logger.error("model %s is not served: %s", model.name, error)

    def _load_model(self, model: ServedModel, assets: dict[str, dict], artifacts: Path) -> None:
        started = time.perf_counter()
        _verify(model.file, model.sha256, "model file")
        for key, asset in assets.items():
            path = artifacts / asset["file"]
            _verify(path, asset["sha256"], f"asset {key}")
            model.assets[key] = np.load(path, allow_pickle=False)
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.settings.intra_op_threads
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(str(model.file), options, providers=session_providers(self.provider))
        model.provider = check_session_provider(session, self.provider, model.name)
        session.run(None, _warm_up_feeds(session))
        model.session = session
        model.output_names = [output.name for output in session.get_outputs()]
        preparer = self.preparers.get(model.task)
        if preparer is not None:
            preparer(model, self.settings)
        logger.info(
            "loaded %s (%s) on %s in %.2fs", model.name, model.task, model.provider, time.perf_counter() - started
        )

    @property
    def ready(self) -> bool:
        return all(model.ready for model in self.models.values())

    def get(self, name: str | None, task: str) -> ServedModel:
        """The named model of `task`, or its default; 404 for unknown names, 503 when not ready."""
        candidates = [model for model in self.models.values() if model.task == task]
        if name is None:
            defaults = [model for model in candidates if model.default] or candidates[:1]
            if not defaults:
                raise UnknownModel(f"No {task} model is configured on this server.")
            model = defaults[0]
        elif name in self.models and self.models[name].task == task:
            model = self.models[name]
        else:
            known = ", ".join(sorted(m.name for m in candidates)) or "none"
            raise UnknownModel(f"Unknown {task} model {name!r}; available: {known}.")
        if not model.ready:
            raise ModelNotReady(f"Model {model.name} is not ready: {model.error}")
        return model


def _verify(path: Path, expected: str, what: str) -> None:
    if not path.exists():
        raise ModelLoadError(f"{what} {path} is missing")
    actual = sha256_of(path)
    if actual != expected:
        raise ModelLoadError(
            f"{what} {path} has sha256 {actual}, but the manifest says {expected}; refusing to serve it"
        )
