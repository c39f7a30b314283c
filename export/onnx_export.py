"""Export a recurrent model to one ONNX graph with its time loop as a Scan node, and check parity."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

OPSET = 18


def export_scan_graph(
    module: torch.nn.Module,
    example: tuple[torch.Tensor, ...],
    input_names: list[str],
    output_names: list[str],
    dynamic_shapes: dict,
    path: Path,
) -> None:
    """Dynamo export of `module(*example, use_scan=True)`. Both recurrent models unroll time with
    `models.unroll.unroll`; the scan path traces to one Scan node, so the graph accepts any batch and length."""
    export_graph(module, example, input_names, output_names, dynamic_shapes, path, {"use_scan": True})


def export_graph(
    module: torch.nn.Module,
    example: tuple[torch.Tensor, ...],
    input_names: list[str],
    output_names: list[str],
    dynamic_shapes: dict,
    path: Path,
    kwargs: dict | None = None,
) -> None:
    """Dynamo export of `module(*example, **kwargs)` under `no_grad` (without it the batch dimension
    silently becomes fixed); fails if the batch dimension of an input came out fixed anyway.

    The exporter's per-node metadata (stack traces with this checkout's absolute paths and line numbers,
    module names) is dropped, so the file's bytes depend on the weights and operations only."""
    kwargs = kwargs or {}
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    module.eval()
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            module,
            example,
            kwargs=kwargs,
            dynamo=True,
            input_names=input_names,
            output_names=output_names,
            dynamic_shapes={**dynamic_shapes, **dict.fromkeys(kwargs)},
            opset_version=OPSET,
            external_data=False,
        )
    program.save(str(path))
    saved = onnx.load(str(path))
    for node in graph_nodes(saved.graph):
        del node.metadata_props[:]
    onnx.save(saved, str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for graph_input in session.get_inputs():
        if graph_input.shape and not isinstance(graph_input.shape[0], str):
            raise RuntimeError(f"export fixed the batch dimension of {graph_input.name}: {graph_input.shape}")


def graph_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of the graph and of its subgraphs (a Scan body)."""
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from graph_nodes(attribute.g)


def max_abs_diff(
    session: ort.InferenceSession, inputs: dict[str, np.ndarray], expected: tuple[torch.Tensor, ...]
) -> float:
    """Largest absolute difference over all outputs between onnxruntime and the given PyTorch outputs."""
    actual = session.run(None, inputs)
    return max(float(np.abs(e.detach().numpy() - a).max()) for e, a in zip(expected, actual, strict=True))
