"""Toy ONNX graphs with the two cost profiles the batcher tells apart, and cost models that have seen them.

- `flat` graph, GPU-like: a Loop of FLAT_STEPS matrix products on a fixed [FLAT_SIZE, FLAT_SIZE] state, whatever
  the batch; its answer, y = 2x, is row-wise (the loop's result is added times 0, so the run cannot skip it).
- `linear` graph, CPU-like: LINEAR_LAYERS row-wise layers h = tanh(h W) of width LINEAR_WIDTH; its cost is
  proportional to the rows, and its answer is a real computation whose bits may depend on the batch's size.

`ProfileRuns` runs either graph in a real ONNX Runtime session and advances a manual clock by the profile's cost,
so the batcher's tests see the profile's costs whatever the machine's speed.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from app.runtime.instances import CostModel
from tests.manual_clock import ManualClock

WIDTH = 64
FLAT_STEPS = 200
FLAT_SIZE = 96
LINEAR_LAYERS = 6
LINEAR_WIDTH = 384


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="mnemo-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def _io(name: str) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", WIDTH])


def _weights(name: str, shape: tuple[int, ...], seed: int) -> onnx.TensorProto:
    values = np.random.default_rng(seed).normal(0, 1 / np.sqrt(shape[0]), shape).astype(np.float32)
    return helper.make_tensor(name, TensorProto.FLOAT, shape, values.ravel().tolist())


def build_flat_onnx(path: Path) -> Path:
    """y = 2x + 0 x sum(the state after FLAT_STEPS steps of state = tanh(state A)): a cost flat in the batch."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("MatMul", ["state_in", "A"], ["product"]),
            helper.make_node("Tanh", ["product"], ["state_out"]),
        ],
        "step",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("state_in", TensorProto.FLOAT, [FLAT_SIZE, FLAT_SIZE]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("state_out", TensorProto.FLOAT, [FLAT_SIZE, FLAT_SIZE]),
        ],
    )
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["x_sum"], keepdims=0),  # the state depends on the input: no folding
        helper.make_node("Mul", ["x_sum", "zero"], ["nothing"]),
        helper.make_node("Add", ["A", "nothing"], ["state0"]),
        helper.make_node("Loop", ["steps", "true", "state0"], ["state"], body=body),
        helper.make_node("ReduceSum", ["state"], ["state_sum"], keepdims=0),
        helper.make_node("Mul", ["state_sum", "zero"], ["still_nothing"]),
        helper.make_node("Mul", ["x", "two"], ["doubled"]),
        helper.make_node("Add", ["doubled", "still_nothing"], ["y"]),
    ]
    initializers = [
        _weights("A", (FLAT_SIZE, FLAT_SIZE), 0),
        helper.make_tensor("steps", TensorProto.INT64, [], [FLAT_STEPS]),
        helper.make_tensor("true", TensorProto.BOOL, [], [True]),
        helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
        helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
    ]
    return _save(helper.make_graph(nodes, "flat", [_io("x")], [_io("y")], initializer=initializers), path)


def build_linear_onnx(path: Path) -> Path:
    """y = x widened to LINEAR_WIDTH, LINEAR_LAYERS layers of tanh(h W_k), narrowed back to WIDTH, row by row: a cost
    proportional to the batch."""
    nodes = [helper.make_node("MatMul", ["x", "widen"], ["h0"])]
    for layer in range(LINEAR_LAYERS):
        nodes.append(helper.make_node("MatMul", [f"h{layer}", f"W{layer}"], [f"p{layer}"]))
        nodes.append(helper.make_node("Tanh", [f"p{layer}"], [f"h{layer + 1}"]))
    nodes.append(helper.make_node("MatMul", [f"h{LINEAR_LAYERS}", "narrow"], ["y"]))
    initializers = [
        _weights("widen", (WIDTH, LINEAR_WIDTH), 1),
        *(_weights(f"W{layer}", (LINEAR_WIDTH, LINEAR_WIDTH), layer + 2) for layer in range(LINEAR_LAYERS)),
        _weights("narrow", (LINEAR_WIDTH, WIDTH), 0),
    ]
    return _save(helper.make_graph(nodes, "linear", [_io("x")], [_io("y")], initializer=initializers), path)


def session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def flat_cost(seconds: float) -> CostModel:
    """A cost model that has seen runs of `seconds` whatever their rows and length."""
    return _seen(lambda rows, length: seconds)


def linear_cost(seconds_per_cell: float) -> CostModel:
    """A cost model that has seen runs of `seconds_per_cell` per cell and nothing fixed."""
    return _seen(lambda rows, length: seconds_per_cell * rows * length)


def _seen(cost) -> CostModel:
    model = CostModel()
    for rows, length in ((1, 1), (8, 1), (1, 4), (32, 4)):
        model.observe(rows, length, cost(rows, length))
    return model


class ProfileRuns:
    """Runs of a toy graph in a real session; each advances `clock` by `cost(rows)` seconds and is recorded."""

    def __init__(self, path: Path, clock: ManualClock, cost) -> None:
        self.session, self.clock, self.cost = session(path), clock, cost
        self.batches: list[int] = []  # rows per run, in the order they finished
        self._lock = threading.Lock()

    def __call__(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        (y,) = self.session.run(["y"], feeds)
        rows = len(feeds["x"])
        self.clock.advance(self.cost(rows))
        with self._lock:
            self.batches.append(rows)
        return {"y": y}
