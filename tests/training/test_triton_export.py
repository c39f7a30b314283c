"""`python -m export.triton`: every config.pbtxt parses as Triton's ModelConfig (the protobuf definitions that
ship in tritonclient) and matches the ONNX graph as ONNX Runtime reads it. No Triton server runs here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from app.core.integrity import sha256_of

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"
ORT_TO_TRITON = {"tensor(float)": "TYPE_FP32", "tensor(int64)": "TYPE_INT64"}
NUMPY_OF = {"TYPE_FP32": np.float32, "TYPE_INT64": np.int64}


def kt_models(artifacts: Path) -> list[dict]:
    return [
        m for m in json.loads((artifacts / "manifest.json").read_text())["models"] if m["task"] == "knowledge-trace"
    ]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The committed models exported by the command a user runs."""
    out = tmp_path_factory.mktemp("triton") / "models"
    done = subprocess.run(
        [sys.executable, "-m", "export.triton", "--out", str(out), "--max-batch-size", "16"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return out


def parse_config(path: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def triton_dims(tensor: model_config_pb2.ModelInput | model_config_pb2.ModelOutput) -> list[int]:
    """The shape the model sees per request: `reshape` when given, else `dims`."""
    return list(tensor.reshape.shape) if tensor.HasField("reshape") else list(tensor.dims)


def test_repository_has_one_version_per_knowledge_trace_model_and_no_similarity_model(repository):
    names = sorted(m["name"] for m in kt_models(ARTIFACTS))
    assert names and sorted(p.name for p in repository.iterdir()) == names
    for entry in kt_models(ARTIFACTS):
        assert sorted(p.name for p in (repository / entry["name"]).iterdir()) == ["1", "config.pbtxt"]
        assert sha256_of(repository / entry["name"] / "1" / "model.onnx") == entry["sha256"]


def test_every_config_parses_and_matches_the_onnx_graph(repository):
    for entry in kt_models(ARTIFACTS):
        config = parse_config(repository / entry["name"] / "config.pbtxt")
        assert config.name == entry["name"] and config.platform == "onnxruntime_onnx"
        assert config.max_batch_size == 16 and config.HasField("dynamic_batching")
        session = ort.InferenceSession(str(ARTIFACTS / entry["file"]), providers=["CPUExecutionProvider"])
        for declared, graph in ((config.input, session.get_inputs()), (config.output, session.get_outputs())):
            assert [t.name for t in declared] == [g.name for g in graph]
            for tensor, node in zip(declared, graph, strict=True):
                assert model_config_pb2.DataType.Name(tensor.data_type) == ORT_TO_TRITON[node.type]
                assert isinstance(node.shape[0], str), f"{node.name}: dim 0 must be the dynamic batch"
                expected = [d if isinstance(d, int) else -1 for d in node.shape[1:]]
                assert triton_dims(tensor) == expected, (entry["name"], node.name)


def test_inputs_shaped_as_the_config_says_run_and_give_outputs_of_the_declared_shapes(repository):
    """What Triton would feed (a batch of 3, every -1 as 7) runs in ONNX Runtime and yields the declared shapes."""
    batch, free = 3, 7
    for entry in kt_models(ARTIFACTS):
        config = parse_config(repository / entry["name"] / "config.pbtxt")
        n_questions = entry["metadata"]["n_questions"]
        rng = np.random.default_rng(0)
        feeds = {}
        for tensor in config.input:
            shape = [batch] + [free if d == -1 else d for d in triton_dims(tensor)]
            dtype = NUMPY_OF[model_config_pb2.DataType.Name(tensor.data_type)]
            if tensor.name == "q":
                feeds[tensor.name] = rng.integers(1, n_questions + 1, size=shape).astype(dtype)
            elif tensor.name == "len":
                feeds[tensor.name] = np.full(shape, free, dtype=dtype)
            elif dtype == np.int64:
                feeds[tensor.name] = rng.integers(0, 2, size=shape).astype(dtype)
            else:
                feeds[tensor.name] = rng.standard_normal(shape).astype(dtype)
        session = ort.InferenceSession(str(repository / entry["name"] / "1" / "model.onnx"))
        outputs = dict(
            zip([o.name for o in config.output], session.run([o.name for o in config.output], feeds), strict=True)
        )
        for tensor in config.output:
            shape = outputs[tensor.name].shape
            assert shape[0] == batch
            for got, declared in zip(shape[1:], triton_dims(tensor), strict=True):
                assert declared == -1 or got == declared, (entry["name"], tensor.name, shape)


def test_a_tampered_model_is_not_exported(tmp_path):
    from export.triton import main

    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    entry = dict(kt_models(ARTIFACTS)[-1])
    (artifacts / entry["file"]).write_bytes((ARTIFACTS / entry["file"]).read_bytes() + b"\0")
    (artifacts / "manifest.json").write_text(json.dumps({"schema_version": 1, "models": [entry]}))
    with pytest.raises(SystemExit, match="does not match the sha256"):
        main(["--out", str(tmp_path / "out"), "--artifacts", str(artifacts)])
    assert not (tmp_path / "out" / entry["name"] / "1" / "model.onnx").exists()
