"""Toy ONNX models built with onnx.helper, their artifacts, and a toy task, for the frame and engine tests.

The frame (settings, providers, registry, middleware, errors, metrics) and the runtime (batcher,
admission, deadlines) are tested with these models, so they do not depend on the trained task
models: real onnxruntime sessions, real manifests with real sha256, the real app over HTTP.

- `toy` graph: y = x * 2 (x float [batch, 3]) and z = k + 1 (k integer [batch]).
- `picky` graph: the toy graph whose z = k + 1 is looked up in a table of PICKY_KS entries (a Gather), so a
  run with a k of PICKY_KS or more fails in onnxruntime itself, with the rows of other requests beside it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Collection
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import onnx
from fastapi import APIRouter, FastAPI, Request
from onnx import TensorProto, helper
from pydantic import BaseModel, Field

from app.core.errors import InvalidInput
from app.core.settings import Settings
from app.main import create_app
from app.runtime.instances import CostModel
from app.runtime.model import ServedModel
from app.transports.deadline import within_deadline
from app.transports.http import read_body
from export.manifest import upsert_model

WIDTH = 3  # x is [batch, WIDTH]; the width is fixed, so a wrong width is rejected by onnxruntime
TOY_TASK = "toy"
OTHER_TASK = "toy-other"
HELD_K = 0  # with HeldRuns, a run with a row of this k waits until released
HELD_FOR_AT_MOST_S = 60
PICKY_KS = 8  # the picky graph answers k = 0..7; a larger k fails its run (InvalidArgument: out of bounds)


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="mnemo-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def _doubling_graph(name: str, z_node: onnx.NodeProto, int_type: int, initializers: list) -> onnx.GraphProto:
    """y = x * 2 (x float [batch, WIDTH]) beside `z_node`, which computes z from k (both `int_type` [batch])."""
    return helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["y"]), z_node],
        name,
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH]),
            helper.make_tensor_value_info("k", int_type, ["batch"]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", WIDTH]),
            helper.make_tensor_value_info("z", int_type, ["batch"]),
        ],
        initializer=[helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]), *initializers],
    )


def build_toy_onnx(path: Path, int_type: int = TensorProto.INT64) -> Path:
    """y = x * 2 (x float [batch, 3]) and z = k + 1 (k integer [batch]), opset 17."""
    add_one = helper.make_node("Add", ["k", "one"], ["z"])
    return _save(_doubling_graph("toy", add_one, int_type, [helper.make_tensor("one", int_type, [], [1])]), path)


def build_picky_onnx(path: Path) -> Path:
    """The toy graph with z = table[k] (table[k] = k + 1 for k < PICKY_KS): a larger k fails the run."""
    look_up = helper.make_node("Gather", ["table", "k"], ["z"], axis=0)
    table = helper.make_tensor("table", TensorProto.INT64, [PICKY_KS], range(1, PICKY_KS + 1))
    return _save(_doubling_graph("picky", look_up, TensorProto.INT64, [table]), path)


def toy_entry(name: str, task: str = TOY_TASK, default: bool = False, **extra) -> dict:
    """A manifest entry for `<name>.onnx` with a `scale` asset `<name>.scale.npy`."""
    return {
        "name": name,
        "task": task,
        "version": "0.0.1",
        "file": f"{name}.onnx",
        "default": default,
        "limits": {"max_rows": 64},
        "metrics": {"test_score": 1.0},
        "metadata": {"width": WIDTH},
        "assets": {"scale": {"file": f"{name}.scale.npy"}},
        "card": f"{name}.md",
        **extra,
    }


def write_toy_artifacts(
    directory: Path,
    entries: list[dict],
    int_type: int = TensorProto.INT64,
    picky: Collection[str] = (),
) -> Path:
    """Build each entry's ONNX file and asset and list them with their real sha256 (export.manifest); the
    entries named in `picky` get the picky graph."""
    directory.mkdir(parents=True, exist_ok=True)
    for entry in entries:
        if entry["name"] in picky:
            build_picky_onnx(directory / entry["file"])
        else:
            build_toy_onnx(directory / entry["file"], int_type)
        for asset in entry.get("assets", {}).values():
            np.save(directory / asset["file"], np.arange(4, dtype=np.float32))
        upsert_model(directory, entry)
    return directory


def write_empty_manifest(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "manifest.json").write_text(json.dumps({"schema_version": 1, "models": []}))
    return directory


class ToyRequest(BaseModel):
    """What the toy endpoint reads."""

    model: str | None = None
    x: list[list[float]] = Field(min_length=1)
    k: list[int] = Field(min_length=1)


toy_router = APIRouter(tags=["toy"])


@toy_router.post("/toy")
async def toy(body: ToyRequest, request: Request) -> dict:
    """Run a toy model the way a task adapter does: registry, InvalidInput, admission, batcher, deadline."""
    model = request.app.state.registry.get(body.model, TOY_TASK)
    for index, value in enumerate(body.k):
        if value < 0:
            raise InvalidInput(("k", index), f"k must be >= 0, got {value}")
    if len(body.k) > model.entry.limits["max_rows"]:
        raise InvalidInput("k", f"at most {model.entry.limits['max_rows']} items")
    feeds = {"x": np.array(body.x, dtype=np.float32), "k": np.array(body.k, dtype=np.int64)}
    with model.batcher.admit(len(body.k)):
        outputs = await within_deadline(
            model.batcher.run(feeds, len(body.k), 1), request.app.state, model.name, receive=request.receive
        )
    return {"model": model.name, "y": outputs["y"].tolist(), "z": outputs["z"].tolist()}


@toy_router.post("/toy/read")
async def toy_read(request: Request) -> dict:
    """The toy endpoint with the body read as the task adapters read theirs (`read_body`: shed before parsing)."""
    body = await read_body(request, ToyRequest, TOY_TASK)
    return await toy(body, request)


@toy_router.get("/toy/bug")
async def bug() -> dict:
    """A deliberate bug, to show what the last-resort handler does."""
    raise RuntimeError("a deliberate bug")


@toy_router.get("/toy/bug/{owner}")
async def bug_of(owner: str) -> dict:
    """The same bug on a path that names someone: the log must not."""
    raise RuntimeError("a deliberate bug")


def toy_body(k: int = 1) -> dict:
    """A POST /toy body of one row."""
    return {"x": [[1] * WIDTH], "k": [k]}


HELD_TOY = toy_body(HELD_K)  # with HeldRuns (python -m tests.toy_server), its run waits until released


def toy_state(model: ServedModel) -> dict[str, float]:
    """What the toy task prepares from a model: the sum of its `scale` asset."""
    return {"scale_sum": float(model.assets["scale"].sum())}


class HeldRuns:
    """A `prepare` that makes a model's runs holdable: a run with a row of k == HELD_K waits on its run-slot
    thread until `release()`, so a test keeps the run slot busy for exactly as long as it needs, whatever the
    machine's speed (`python -m tests.toy_server` releases on SIGUSR1)."""

    def __init__(self) -> None:
        self._released = threading.Event()

    def prepare(self, model: ServedModel) -> dict[str, float]:
        """Hold the model's runs; forget the cost its warm-up runs taught, so that a lone request (a held one) is
        not run on the event loop before a run has shown what its runs cost."""
        for instance in model.instances:  # the runtime's batcher calls `instance.run`, after prepare
            instance.run = self._held(instance.run)
            instance.cost = CostModel()
        return toy_state(model)

    def _held(self, run):
        def held_run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            if (feeds["k"] == HELD_K).any() and not self._released.wait(HELD_FOR_AT_MOST_S):
                raise TimeoutError("a held toy run was never released")
            return run(feeds)

        return held_run

    def release(self) -> None:
        self._released.set()


class ToyTask:
    """A task over the toy graphs; `prepare` may be replaced to observe or fail."""

    tag = "toy"
    endpoints = ()
    routes = toy_router
    tensors = None
    graphs = MappingProxyType({})

    def __init__(self, name: str = TOY_TASK, prepare=None) -> None:
        self.name = name
        self._prepare = prepare

    def prepare(self, model: ServedModel) -> Any:
        return self._prepare(model) if self._prepare else toy_state(model)

    def describe(self, model: ServedModel) -> dict[str, Any]:
        return {"width": model.entry.metadata["width"]}


def toy_tasks(prepare=None) -> dict[str, ToyTask]:
    """The toy task (with an optional `prepare(model)`) and a second task for "the other task" cases."""
    other = ToyTask(OTHER_TASK)
    other.routes = APIRouter()
    return {TOY_TASK: ToyTask(TOY_TASK, prepare), OTHER_TASK: other}


def toy_app(settings: Settings, prepare=None) -> FastAPI:
    """The real app serving the toy tasks instead of the real ones; /toy/read reserves like a task endpoint."""
    app = create_app(settings, tasks=toy_tasks(prepare))
    app.state.reserving["/toy/read"] = TOY_TASK
    return app


def create_toy_app() -> FastAPI:
    """uvicorn factory (`uvicorn tests.toy_model:create_toy_app --factory`), settings from MNEMO_*."""
    return toy_app(Settings())
