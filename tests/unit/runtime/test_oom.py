"""A batch the device cannot hold is split and run again; one row that cannot fit is a 503, never a dead process.

No GPU runs here, so the device's allocator is stood in for by the same allocator class on CPU: onnxruntime's
BFCArena, bounded (`OrtArenaCfg`, registered for the process and used by sessions that opt in with
`session.use_env_allocators`). A run that needs more than the bound fails inside onnxruntime exactly as a CUDA
session past `gpu_mem_limit` does (the same arena code), and the session stays usable after it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from app.core.metrics import Metrics
from app.runtime.instances import OOM_MESSAGES, DeviceOutOfMemory, Instance, session_instance

ARENA_BYTES = 256 * 1024
ROW_FLOATS = 1024  # 4 KiB per row in and out: 64 rows (512 KiB) cannot run in the arena, 16 rows (128 KiB) can


def _relu_graph(path: Path) -> Path:
    """y = Relu(x) * 2, x float [batch, width] (both dynamic): memory grows with rows and with width."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "two"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "width"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "width"])],
        initializer=[helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def bounded_session(tmp_path_factory) -> ort.InferenceSession:
    """A real session whose every allocation comes from an arena of ARENA_BYTES (kSameAsRequested)."""
    memory = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
    ort.create_and_register_allocator(memory, ort.OrtArenaCfg(ARENA_BYTES, 1, -1, -1))
    options = ort.SessionOptions()
    options.add_session_config_entry("session.use_env_allocators", "1")
    path = _relu_graph(tmp_path_factory.mktemp("oom") / "relu.onnx")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _instance(session: ort.InferenceSession, metrics: Metrics) -> Instance:
    """The instance the registry would build for this session."""
    return session_instance("cpu-0", session, "relu", metrics)


def _rows(count: int, width: int = ROW_FLOATS) -> dict[str, np.ndarray]:
    return {"x": np.arange(count * width, dtype=np.float32).reshape(count, width) - count * width / 2}


def test_the_bounded_arena_really_fails_a_large_batch(bounded_session):
    """The premise: onnxruntime itself refuses the 64-row run, and runs 16 rows after that."""
    with pytest.raises(Exception) as raised:
        bounded_session.run(["y"], _rows(64))
    assert any(part in str(raised.value) for part in OOM_MESSAGES)
    assert bounded_session.run(["y"], _rows(16))[0].shape == (16, ROW_FLOATS)


def test_a_batch_too_large_for_the_device_is_split_and_answers_the_same(bounded_session):
    metrics = Metrics()
    instance = _instance(bounded_session, metrics)
    feeds = _rows(64)
    outputs = instance.run(feeds)
    np.testing.assert_array_equal(outputs["y"], np.maximum(feeds["x"], 0) * 2)
    assert 1 <= instance.max_rows <= 32  # the most rows seen to fit: the batcher's ceiling from now on
    assert metrics.registry.get_sample_value("mnemo_oom_splits_total", {"model": "relu"}) >= 1
    assert instance.run(_rows(8))["y"].shape == (8, ROW_FLOATS)  # the session serves on


def test_one_row_that_cannot_fit_is_a_503_and_the_session_serves_on(bounded_session):
    instance = _instance(bounded_session, Metrics())
    with pytest.raises(DeviceOutOfMemory, match="relu: one row of this request does not fit") as raised:
        instance.run(_rows(2, width=ARENA_BYTES // 2))  # one row of 512 KiB in and out
    assert raised.value.status_code == 503 and raised.value.headers["Retry-After"]
    assert instance.run(_rows(4))["y"].shape == (4, ROW_FLOATS)


def test_other_errors_are_not_taken_for_memory(bounded_session):
    instance = _instance(bounded_session, Metrics())
    with pytest.raises(Exception, match=r"INVALID_ARGUMENT|Invalid rank") as raised:
        instance.run({"x": np.ones(4, np.float32)})
    assert not any(part in str(raised.value) for part in OOM_MESSAGES) and instance.max_rows is None
