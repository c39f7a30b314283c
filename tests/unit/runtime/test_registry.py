"""The verified registry on toy ONNX models: hashes, assets, warm-up, task state, defaults, not-ready handling."""

from __future__ import annotations

import json
import pickle
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from app.core.errors import ModelNotReady, UnknownModel
from app.core.integrity import sha256_of
from app.core.metrics import Metrics
from app.runtime.registry import ModelLoadError, ModelRegistry
from tests.helpers import app_client, app_settings
from tests.toy_model import (
    OTHER_TASK,
    TOY_TASK,
    toy_entry,
    toy_tasks,
    write_empty_manifest,
    write_toy_artifacts,
)


def _registry(artifacts, prepare=None, **overrides) -> ModelRegistry:
    registry = ModelRegistry(app_settings(artifacts, **overrides), toy_tasks(prepare), Metrics())
    registry.load()
    return registry


def test_models_are_verified_loaded_with_their_assets_and_ready(toy_artifacts):
    registry = _registry(toy_artifacts)
    assert set(registry.models) == {"toy-a", "toy-b", "toy-kt"} and all(m.ready for m in registry.models.values())
    model = registry.models["toy-a"]
    assert model.entry.sha256 == sha256_of(toy_artifacts / "toy-a.onnx")
    assert [instance.provider for instance in model.instances] == ["CPUExecutionProvider"] and model.session
    np.testing.assert_array_equal(model.assets["scale"], np.arange(4, dtype=np.float32))
    assert (model.entry.limits, model.entry.metrics, model.entry.metadata, model.entry.card) == (
        {"max_rows": 64},
        {"test_score": 1.0},
        {"width": 3},
        "toy-a.md",
    )


def test_run_returns_outputs_by_name_and_is_not_a_request_run(toy_artifacts):
    registry = _registry(toy_artifacts)
    model = registry.get("toy-b", TOY_TASK)
    outputs = model.instances[0].run({"x": np.ones((2, 3), np.float32), "k": np.array([4, 5], np.int64)})
    np.testing.assert_array_equal(outputs["y"], np.full((2, 3), 2.0))
    np.testing.assert_array_equal(outputs["z"], [5, 6])
    # mnemo_inference_duration_seconds times the batcher's runs, as mnemo_batch_size_rows counts them (test_http)
    assert "mnemo_inference_duration_seconds_count" not in registry.metrics.render().decode()


def test_get_returns_the_named_model_else_the_task_default(toy_artifacts):
    registry = _registry(toy_artifacts)
    assert registry.get(None, TOY_TASK).name == "toy-a"  # default: true
    assert registry.get("toy-b", TOY_TASK).name == "toy-b"
    assert registry.get(None, OTHER_TASK).name == "toy-kt"  # the only one of its task
    with pytest.raises(UnknownModel, match="'nope'; available: toy-a, toy-b"):
        registry.get("nope", TOY_TASK)
    with pytest.raises(UnknownModel, match="available: toy-a, toy-b"):
        registry.get("toy-kt", TOY_TASK)  # a model of the other task is not one of this task


def test_warm_up_fills_any_integer_type(tmp_path):
    """int32 inputs are warmed with int32 ones (the graph would reject int64)."""
    artifacts = write_toy_artifacts(tmp_path, [toy_entry("toy-int32")], int_type=TensorProto.INT32)
    registry = _registry(artifacts)
    assert registry.models["toy-int32"].ready


def test_prepare_runs_once_per_model_of_its_task_before_ready(toy_artifacts):
    calls = []

    def prepare(model):
        assert model.session is not None and "scale" in model.assets  # verified, loaded and warmed first
        calls.append(model.name)
        return {"scale_sum": float(model.assets["scale"].sum()), "name": model.name}

    registry = _registry(toy_artifacts, prepare)
    assert sorted(calls) == ["toy-a", "toy-b"]
    assert registry.models["toy-a"].state == {"scale_sum": 6.0, "name": "toy-a"}
    assert registry.models["toy-kt"].state == {"scale_sum": 6.0}  # the other task's own prepare


def test_a_failing_prepare_stops_startup_or_leaves_the_model_not_ready(toy_artifacts):
    def prepare(model):
        if model.name == "toy-b":
            raise ValueError("toy-b lacks its vocabulary")

    with pytest.raises(ModelLoadError, match="toy-b: toy-b lacks its vocabulary"):
        _registry(toy_artifacts, prepare)
    registry = _registry(toy_artifacts, prepare, on_model_error="skip")
    assert registry.models["toy-a"].ready and not registry.models["toy-b"].ready
    with pytest.raises(ModelNotReady, match="toy-b is not ready: toy-b lacks its vocabulary"):
        registry.get("toy-b", TOY_TASK)


# -- a tampered or missing artifact is never served -------------------------------------------------
def _tamper(path):
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("target", ["toy-b.onnx", "toy-b.scale.npy"])
def test_tampered_file_stops_startup_by_default(toy_artifacts, target):
    _tamper(toy_artifacts / target)
    with (
        pytest.raises(ModelLoadError, match=r"toy-b: .*toy-b.* has sha256 \w+, but the manifest says"),
        app_client(toy_artifacts, toy=True),
    ):
        pass


@pytest.mark.parametrize("target", ["toy-b.onnx", "toy-b.scale.npy"])
def test_tampered_file_in_skip_mode_is_listed_not_ready_and_never_served(toy_artifacts, target):
    _tamper(toy_artifacts / target)
    with app_client(toy_artifacts, toy=True, on_model_error="skip") as client:
        assert client.get("/health").status_code == 200
        ready = client.get("/ready")
        assert ready.status_code == 503 and ready.json() == {"detail": "Models not ready: toy-b."}
        listed = {m["name"]: m for m in client.get("/models").json()["models"]}
        assert listed["toy-b"]["ready"] is False and "sha256" in listed["toy-b"]["error"]
        assert listed["toy-b"]["provider"] is None and listed["toy-a"]["ready"] is True
        refused = client.post("/toy", json={"model": "toy-b", "x": [[1, 2, 3]], "k": [1]})
        assert refused.status_code == 503 and "toy-b is not ready" in refused.json()["detail"]
        assert client.post("/toy", json={"x": [[1, 2, 3]], "k": [1]}).json()["model"] == "toy-a"


def test_missing_model_file_is_a_clear_error(toy_artifacts):
    (toy_artifacts / "toy-kt.onnx").unlink()
    with pytest.raises(ModelLoadError, match=r"toy-kt: model file toy-kt\.onnx is missing"):
        _registry(toy_artifacts)


def test_a_file_that_is_not_onnx_is_a_load_error_not_a_crash(tmp_path):
    artifacts = write_toy_artifacts(tmp_path, [toy_entry("toy-a")])
    (artifacts / "toy-a.onnx").write_bytes(b"not an onnx graph")
    entry = json.loads((artifacts / "manifest.json").read_text())
    entry["models"][0]["sha256"] = sha256_of(artifacts / "toy-a.onnx")  # hash matches; content is broken
    (artifacts / "manifest.json").write_text(json.dumps(entry))
    registry = _registry(artifacts, on_model_error="skip")
    assert not registry.models["toy-a"].ready and registry.models["toy-a"].error


def _graph_with_input_shape(path, shape):
    """An ONNX file whose one input x (float) has `shape`, and y = x."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "shaped",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def _rewritten(tmp_path, file, write, asset=None):
    """Toy artifacts whose `file` `write` rewrites, its sha256 (of the model, or of `asset`) updated to match."""
    artifacts = write_toy_artifacts(tmp_path, [toy_entry("toy-a")])
    write(artifacts / file)
    manifest = json.loads((artifacts / "manifest.json").read_text())
    entry = manifest["models"][0] if asset is None else manifest["models"][0]["assets"][asset]
    entry.update(file=file, sha256=sha256_of(artifacts / file))
    (artifacts / "manifest.json").write_text(json.dumps(manifest))
    return artifacts


@pytest.mark.parametrize(
    ("file", "write", "asset", "says"),
    [
        ("toy-a.onnx", lambda path: path.write_bytes(b"not an onnx graph"), None, "Load model from toy-a.onnx failed"),
        ("toy-a.onnx", lambda path: _graph_with_input_shape(path, [0, 3]), None, "input: x for the following indices"),
        ("toy-a.onnx", lambda path: _graph_with_input_shape(path, ["batch", 0]), None, "index: 1 Got: 1 Expected: 0"),
        ("toy-a.scale.npy", lambda path: path.write_bytes(pickle.dumps([1.0])), "scale", "not an .npy array"),
        ("toy-a.scale.npy", lambda path: path.write_bytes(b""), "scale", "not an .npy array"),
        ("toy-a.npz", lambda path: np.savez(path, scale=np.ones(4)), "scale", "scale toy-a.npz is not an .npy array"),
    ],
    ids=["not-onnx", "zero-batch-dim", "zero-length-dim", "pickle-asset", "empty-asset", "npz-asset"],
)
def test_a_hostile_file_is_one_line_naming_the_model_and_never_a_server_path(tmp_path, file, write, asset, says):
    artifacts = _rewritten(tmp_path, file, write, asset)
    with pytest.raises(ModelLoadError, match=f"^model toy-a: .*{re.escape(says)}") as raised:
        _registry(artifacts)
    message = str(raised.value)
    assert "\n" not in message and str(tmp_path) not in message
    with app_client(artifacts, toy=True, on_model_error="skip") as client:
        listed = client.get("/models").json()["models"][0]
        assert listed["ready"] is False and says in listed["error"] and str(tmp_path) not in listed["error"]


# -- the manifest itself ----------------------------------------------------------------------------
def test_empty_manifest_is_valid_and_ready(tmp_path):
    with app_client(write_empty_manifest(tmp_path), toy=True) as client:
        assert client.get("/ready").json() == {"status": "ready", "models": 0}
        assert client.get("/models").json() == {"models": []}
        response = client.post("/toy", json={"x": [[1, 2, 3]], "k": [1]})
        assert response.status_code == 404 and "No toy model" in response.json()["detail"]


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        (None, "no manifest.json in .*: set MNEMO_ARTIFACTS_DIR"),
        ("{not json", "manifest.json is not JSON"),
        ('{"models": ' + "[" * 100_000 + "]" * 100_000 + "}", "manifest.json is not JSON: maximum recursion depth"),
        ("[]", "does not match the schema: the manifest: Input should be a valid dictionary"),
        ({"models": [{"name": "x"}]}, "models.0.task: Field required"),
        ({"models": [{**toy_entry("x", assets={}), "limits": {"max_rows": "x"}, "sha256": "0" * 64}]}, "max_rows"),
        ({"models": [{**toy_entry("x", task="chat", assets={}), "sha256": "0" * 64}]}, "unknown task 'chat'"),
    ],
)
def test_a_broken_manifest_is_a_clear_startup_error(tmp_path, manifest, message):
    if manifest is not None:
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        (tmp_path / "manifest.json").write_text(text)
    with pytest.raises(ModelLoadError, match=message):
        _registry(tmp_path, on_model_error="skip")


def test_a_manifest_that_is_not_utf8_is_a_clear_startup_error(tmp_path):
    (tmp_path / "manifest.json").write_bytes(b"\xff\xfe{")
    with pytest.raises(ModelLoadError, match=r"manifest\.json is not JSON: 'utf-8' codec can't decode byte 0xff"):
        _registry(tmp_path)


def test_a_model_listed_twice_is_refused_naming_it(tmp_path):
    artifacts = write_toy_artifacts(tmp_path, [toy_entry("toy-a"), toy_entry("toy-b")])
    manifest = json.loads((artifacts / "manifest.json").read_text())
    manifest["models"] += manifest["models"][:1]
    (artifacts / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelLoadError, match=r"names must be unique, not toy-a \(listed twice\)"):
        _registry(artifacts, on_model_error="skip")


def test_two_defaults_for_one_task_are_refused(tmp_path):
    artifacts = write_toy_artifacts(tmp_path, [toy_entry("toy-a", default=True), toy_entry("toy-b", default=True)])
    with pytest.raises(ModelLoadError, match="at most one default toy model, not toy-a, toy-b"):
        _registry(artifacts)
