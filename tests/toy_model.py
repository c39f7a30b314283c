"""Toy ONNX models built with onnx.helper, their artifacts, and a toy task, for the frame and engine tests.

The frame (settings, providers, registry, middleware, errors, metrics) and the runtime (batcher,
admission, deadlines) are tested with these models, so they do not depend on the trained task
models: real onnxruntime sessions, real manifests with real sha256, the real app over HTTP.

- `toy` graph: y = x * 2 (x float [batch, 3]) and z = k + 1 (k integer [batch]).
- `slow` graph: the same, plus a Loop of `spin[0]` 128x128 matrix products before y, so a test can
  make one ONNX run take a chosen time (each iteration is tens of microseconds).
- `picky` graph: the toy graph whose z = k + 1 is looked up in a table of PICKY_KS entries (a Gather), so a
  run with a k of PICKY_KS or more fails in onnxruntime itself, with the rows of other requests beside it.
"""

from __future__ import annotations

import json
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
from app.runtime.model import ServedModel
from app.transports.http import complete, read_body, registry
from export.manifest import upsert_model

WIDTH = 3  # x is [batch, WIDTH]; the width is fixed, so a wrong width is rejected by onnxruntime
TOY_TASK = "toy"
OTHER_TASK = "toy-other"
SPIN_SIZE = 128
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


def build_slow_onnx(path: Path) -> Path:
    """The toy graph whose run first multiplies a 128x128 matrix by itself `k[0]` times (a Loop)."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("MatMul", ["m_in", "m_in"], ["product"]),
            helper.make_node("Tanh", ["product"], ["m_out"]),
        ],
        "spin",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("m_in", TensorProto.FLOAT, [SPIN_SIZE, SPIN_SIZE]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("m_out", TensorProto.FLOAT, [SPIN_SIZE, SPIN_SIZE]),
        ],
    )
    start = np.full((SPIN_SIZE, SPIN_SIZE), 0.01, dtype=np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["k", "zero"], ["iterations"], axis=0),
            helper.make_node("Loop", ["iterations", "true", "start"], ["spun"], body=body),
            helper.make_node("ReduceSum", ["spun"], ["total"], keepdims=0),
            helper.make_node("Mul", ["total", "nothing"], ["offset"]),
            helper.make_node("Mul", ["x", "two"], ["doubled"]),
            helper.make_node("Add", ["doubled", "offset"], ["y"]),
            helper.make_node("Add", ["k", "one"], ["z"]),
        ],
        "slow",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH]),
            helper.make_tensor_value_info("k", TensorProto.INT64, ["batch"]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", WIDTH]),
            helper.make_tensor_value_info("z", TensorProto.INT64, ["batch"]),
        ],
        initializer=[
            helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
            helper.make_tensor("one", TensorProto.INT64, [], [1]),
            helper.make_tensor("zero", TensorProto.INT64, [], [0]),
            helper.make_tensor("true", TensorProto.BOOL, [], [True]),
            helper.make_tensor("nothing", TensorProto.FLOAT, [], [0.0]),
            helper.make_tensor("start", TensorProto.FLOAT, [SPIN_SIZE, SPIN_SIZE], start.ravel().tolist()),
        ],
    )
    return _save(graph, path)


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
    slow: bool = False,
    picky: Collection[str] = (),
) -> Path:
    """Build each entry's ONNX file and asset and list them with their real sha256 (export.manifest); the
    entries named in `picky` get the picky graph."""
    directory.mkdir(parents=True, exist_ok=True)
    for entry in entries:
        if entry["name"] in picky:
            build_picky_onnx(directory / entry["file"])
        elif slow:
            build_slow_onnx(directory / entry["file"])
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
    model = registry(request).get(body.model, TOY_TASK)
    for index, value in enumerate(body.k):
        if value < 0:
            raise InvalidInput(("k", index), f"k must be >= 0, got {value}")
    if len(body.k) > model.limits["max_rows"]:
        raise InvalidInput("k", f"at most {model.limits['max_rows']} items")
    feeds = {"x": np.array(body.x, dtype=np.float32), "k": np.array(body.k, dtype=np.int64)}
    with model.batcher.admit(len(body.k)):
        outputs = await complete(request, model.batcher.run(feeds, len(body.k), 1), model.name)
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


class ToyTask:
    """A task over the toy graphs; `prepare` may be replaced to observe or fail."""

    tag = "toy"
    endpoints = ()
    routes = toy_router
    tensors = None
    sequence_inputs = ()
    sequence_outputs = MappingProxyType({})

    def __init__(self, name: str = TOY_TASK, prepare=None) -> None:
        self.name = name
        self._prepare = prepare

    def prepare(self, model: ServedModel) -> Any:
        return self._prepare(model) if self._prepare else {"scale_sum": float(model.assets["scale"].sum())}

    def describe(self, model: ServedModel) -> dict[str, Any]:
        return {"width": model.metadata["width"]}


def toy_tasks(prepare=None) -> dict[str, ToyTask]:
    """The toy task (with an optional `prepare(model)`) and a second task for "the other task" cases."""
    other = ToyTask(OTHER_TASK)
    other.routes = APIRouter()
    return {TOY_TASK: ToyTask(TOY_TASK, prepare), OTHER_TASK: other}


def toy_app(settings: Settings, prepare=None) -> FastAPI:
    """The real app serving the toy tasks instead of the real ones."""
    return create_app(settings, tasks=toy_tasks(prepare))


def create_toy_app() -> FastAPI:
    """uvicorn factory (`uvicorn tests.toy_model:create_toy_app --factory`), settings from MNEMO_*."""
    return toy_app(Settings())
