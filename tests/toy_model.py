"""A toy ONNX model built with onnx.helper, its artifacts directory, and a toy task router, for the frame tests.

The frame (settings, providers, registry, middleware, errors, metrics) is tested with this model, so it
does not depend on the trained task models: real onnxruntime sessions, real manifests with real sha256,
the real app over HTTP.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from fastapi import APIRouter, FastAPI, Request
from onnx import TensorProto, helper
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from app.errors import InvalidInput
from app.main import create_app
from app.registry import Preparer
from app.settings import Settings
from export.manifest import upsert_model

WIDTH = 3  # x is [batch, WIDTH]; the width is fixed, so a wrong width is rejected by onnxruntime
TOY_TASK = "similarity"  # the toy models borrow a real task name; tests pass their own preparers


def build_toy_onnx(path: Path, int_type: int = TensorProto.INT64) -> Path:
    """y = x * 2 (x float [batch, 3]) and z = k + 1 (k integer [batch]), opset 17."""
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "two"], ["y"]),
            helper.make_node("Add", ["k", "one"], ["z"]),
        ],
        "toy",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH]),
            helper.make_tensor_value_info("k", int_type, ["batch"]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", WIDTH]),
            helper.make_tensor_value_info("z", int_type, ["batch"]),
        ],
        initializer=[
            helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
            helper.make_tensor("one", int_type, [], [1]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="mnemo-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def toy_entry(name: str, task: str = TOY_TASK, default: bool = False, **extra) -> dict:
    """A manifest entry for `<name>.onnx` with a `scale` asset `<name>.scale.npy`."""
    return {
        "name": name,
        "task": task,
        "version": "0.0.1",
        "file": f"{name}.onnx",
        "default": default,
        "limits": {"max_batch": 4},
        "metrics": {"test_score": 1.0},
        "metadata": {"width": WIDTH},
        "assets": {"scale": {"file": f"{name}.scale.npy"}},
        "card": f"{name}.md",
        **extra,
    }


def write_toy_artifacts(directory: Path, entries: list[dict], int_type: int = TensorProto.INT64) -> Path:
    """Build each entry's ONNX file and asset and list them with their real sha256 (export.manifest)."""
    directory.mkdir(parents=True, exist_ok=True)
    for entry in entries:
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
    """Run a toy model the way a task router does: registry.get, InvalidInput, run in a worker thread."""
    model = request.app.state.registry.get(body.model, TOY_TASK)
    for index, value in enumerate(body.k):
        if value < 0:
            raise InvalidInput(("k", index), f"k must be >= 0, got {value}")
    if len(body.k) > model.limits["max_batch"]:
        raise InvalidInput("k", f"at most {model.limits['max_batch']} items")
    feeds = {"x": np.array(body.x, dtype=np.float32), "k": np.array(body.k, dtype=np.int64)}
    outputs = await run_in_threadpool(model.run, feeds)
    return {"model": model.name, "y": outputs["y"].tolist(), "z": outputs["z"].tolist()}


@toy_router.get("/toy/bug")
async def bug() -> dict:
    """A deliberate bug, to show what the last-resort handler does."""
    raise RuntimeError("a deliberate bug")


def toy_app(settings: Settings, preparers: dict[str, Preparer] | None = None) -> FastAPI:
    """The real app with the toy router added; the task routers' own preparers are replaced."""
    app = create_app(settings, preparers={} if preparers is None else preparers)
    app.include_router(toy_router)
    return app


def create_toy_app() -> FastAPI:
    """uvicorn factory (`uvicorn tests.toy_model:create_toy_app --factory`), settings from MNEMO_*."""
    return toy_app(Settings())
