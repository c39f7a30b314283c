"""Write a Triton Inference Server model repository for the DKVMN models of a manifest.

python -m export.triton --out triton-models [--artifacts artifacts] [--max-batch-size 32]

For each knowledge-trace model: `<name>/1/model.onnx` (the manifest's file, its sha256 checked) and
`<name>/config.pbtxt` (platform onnxruntime_onnx, dynamic batching, the inputs and outputs read from the ONNX
graph). The graphs' dim 0 is their dynamic batch dimension; Triton's `dims` leave it out, and an input of
shape [batch] alone becomes `dims: [ 1 ]` reshaped to `[ ]`. The similarity models are not exported: they
need the tokenizer and the GloVe lookup in front (docs/deployment.md).
"""

from __future__ import annotations

import argparse
import shutil
from dataclasses import dataclass
from pathlib import Path

import onnx

from app.core.integrity import sha256_of
from app.core.settings import DEFAULT_ARTIFACTS_DIR
from export.manifest import load_manifest
from models.cli import non_negative_int

TASK = "knowledge-trace"
TRITON_DTYPES = {
    onnx.TensorProto.FLOAT: "TYPE_FP32",
    onnx.TensorProto.DOUBLE: "TYPE_FP64",
    onnx.TensorProto.INT64: "TYPE_INT64",
    onnx.TensorProto.INT32: "TYPE_INT32",
    onnx.TensorProto.BOOL: "TYPE_BOOL",
}


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output as Triton sees it: name, data type and dims without the batch dimension."""

    name: str
    data_type: str
    dims: tuple[int, ...]


def tensor_specs(values: list[onnx.ValueInfoProto]) -> list[TensorSpec]:
    """Triton specs of graph inputs or outputs; dim 0 must be the dynamic batch dimension."""
    specs = []
    for value in values:
        tensor = value.type.tensor_type
        dims = list(tensor.shape.dim)
        if not dims or not dims[0].dim_param:
            raise ValueError(f"{value.name}: dim 0 must be the dynamic batch dimension, got {dims[:1]}")
        if tensor.elem_type not in TRITON_DTYPES:
            raise ValueError(f"{value.name}: no Triton type for ONNX element type {tensor.elem_type}")
        rest = tuple(dim.dim_value if dim.HasField("dim_value") else -1 for dim in dims[1:])
        specs.append(TensorSpec(value.name, TRITON_DTYPES[tensor.elem_type], rest))
    return specs


def _tensor_block(spec: TensorSpec) -> str:
    """One `input`/`output` entry; a batch-only tensor is `dims: [ 1 ]` with `reshape: { shape: [ ] }`."""
    dims = spec.dims or (1,)
    lines = [
        f'    name: "{spec.name}"',
        f"    data_type: {spec.data_type}",
        f"    dims: [ {', '.join(map(str, dims))} ]",
    ]
    if not spec.dims:
        lines.append("    reshape: { shape: [ ] }")
    return "  {\n" + "\n".join(lines) + "\n  }"


def model_config(name: str, graph: onnx.GraphProto, max_batch_size: int, max_queue_delay_us: int) -> str:
    """config.pbtxt text (protobuf text format of Triton's ModelConfig) for one ONNX graph."""
    inputs = ",\n".join(_tensor_block(spec) for spec in tensor_specs(list(graph.input)))
    outputs = ",\n".join(_tensor_block(spec) for spec in tensor_specs(list(graph.output)))
    return (
        f'name: "{name}"\n'
        'platform: "onnxruntime_onnx"\n'
        f"max_batch_size: {max_batch_size}\n"
        f"input [\n{inputs}\n]\n"
        f"output [\n{outputs}\n]\n"
        "dynamic_batching {\n"
        f"  max_queue_delay_microseconds: {max_queue_delay_us}\n"
        "}\n"
    )


def export_repository(artifacts: Path, out: Path, max_batch_size: int, max_queue_delay_us: int) -> list[str]:
    """Write one Triton model directory per knowledge-trace model of the manifest; return their names."""
    names = []
    for entry in load_manifest(artifacts)["models"]:
        if entry["task"] != TASK:
            continue
        source = artifacts / entry["file"]
        if sha256_of(source) != entry["sha256"]:
            raise SystemExit(f"{source} does not match the sha256 in the manifest; refusing to export it")
        graph = onnx.load(source).graph
        version_dir = out / entry["name"] / "1"
        version_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, version_dir / "model.onnx")
        config = model_config(entry["name"], graph, max_batch_size, max_queue_delay_us)
        (out / entry["name"] / "config.pbtxt").write_text(config)
        names.append(entry["name"])
    return names


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="model repository directory to write")
    parser.add_argument("--artifacts", type=Path, default=DEFAULT_ARTIFACTS_DIR, help="directory with manifest.json")
    parser.add_argument("--max-batch-size", type=int, default=32, help="Triton max_batch_size (default 32)")
    parser.add_argument(
        "--max-queue-delay-us",
        type=non_negative_int,
        default=5000,
        help="dynamic batching: longest wait for a batch to fill (default 5000)",
    )
    args = parser.parse_args(argv)
    if args.max_batch_size < 1:
        parser.error("--max-batch-size must be at least 1")
    if not (args.artifacts / "manifest.json").is_file():
        parser.error(f"--artifacts: {args.artifacts} holds no manifest.json")
    names = export_repository(args.artifacts, args.out, args.max_batch_size, args.max_queue_delay_us)
    print(f"wrote {len(names)} model(s) to {args.out}: {', '.join(names)}")


if __name__ == "__main__":
    main()
