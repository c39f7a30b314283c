"""Manifest paths stay inside the artifacts directory, and wrong types stop startup with one clear line.

Served in skip mode over real HTTP: a model whose file escapes is not ready, and /models shows neither
the escaped file's sha256 nor any server path.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from app.core.integrity import sha256_of
from app.runtime.registry import ModelLoadError
from tests.helpers import app_client
from tests.toy_model import toy_entry, write_toy_artifacts


def _artifacts_with(tmp_path: Path, **changes) -> tuple[Path, Path]:
    """Toy artifacts whose toy-b entry gets `changes`; and a valid model file outside the directory (with its
    sha256 in the manifest, so only the confinement can refuse it)."""
    artifacts = write_toy_artifacts(tmp_path / "artifacts", [toy_entry("toy-a", default=True), toy_entry("toy-b")])
    outside = tmp_path / "secret.onnx"
    outside.write_bytes((artifacts / "toy-b.onnx").read_bytes())
    manifest = json.loads((artifacts / "manifest.json").read_text())
    for entry in manifest["models"]:
        if entry["name"] == "toy-b":
            entry.update({key: value(outside) if callable(value) else value for key, value in changes.items()})
    (artifacts / "manifest.json").write_text(json.dumps(manifest))
    return artifacts, outside


@pytest.mark.parametrize(
    ("file", "message"),
    [
        (lambda outside: str(outside), "must be relative to the artifacts directory"),
        (lambda outside: f"../{outside.name}", "leads outside the artifacts directory"),
        (lambda outside: "link.onnx", "leads outside the artifacts directory"),
    ],
    ids=["absolute", "dot-dot", "symlink"],
)
def test_paths_out_of_the_artifacts_directory_are_refused(tmp_path, file, message):
    artifacts, outside = _artifacts_with(tmp_path, file=file, sha256=lambda outside: sha256_of(outside))
    os.symlink(outside, artifacts / "link.onnx")
    with pytest.raises(ModelLoadError, match=message), app_client(artifacts, toy=True):
        pass
    with app_client(artifacts, toy=True, on_model_error="skip") as client:
        listed = {model["name"]: model for model in client.get("/models").json()["models"]}
        assert listed["toy-b"]["ready"] is False and message in listed["toy-b"]["error"]
        text = client.get("/models").text
        assert str(tmp_path) not in text
        assert client.get("/ready").status_code == 503


def test_a_limit_of_the_wrong_type_stops_startup_naming_the_field(tmp_path):
    artifacts, _ = _artifacts_with(tmp_path, limits={"max_tokens": "lots"})
    with (
        pytest.raises(ModelLoadError, match=r"models\.1\.limits\.max_tokens.*valid"),
        app_client(artifacts, toy=True, on_model_error="skip"),
    ):
        pass


def test_a_wrong_shaped_manifest_is_one_clear_line(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"models": ["rmc-vlmp-sick.onnx"]}))
    with (
        pytest.raises(ModelLoadError, match=r"models\.0: Input should be a valid dictionary") as error,
        app_client(tmp_path, toy=True),
    ):
        pass
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize(
    ("field", "changes"),
    [
        ("batching.max_wait_ms", lambda value: {"batching": {"max_wait_ms": value}}),
        ("batching.max_cells", lambda value: {"batching": {"max_cells": value}}),
        ("limits.max_tokens", lambda value: {"limits": {"max_tokens": value}}),
    ],
)
def test_a_number_that_is_not_finite_stops_startup_naming_the_model_the_field_and_the_rule(
    tmp_path, field, changes, value
):
    artifacts, _ = _artifacts_with(tmp_path, **changes(value))
    expected = rf"models\.1\.{re.escape(field)}: Input should be a finite number \(model toy-b\)$"
    with pytest.raises(ModelLoadError, match=expected), app_client(artifacts, toy=True):
        pass


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_metric_that_is_not_finite_stops_startup_naming_it(tmp_path, value):
    artifacts, _ = _artifacts_with(tmp_path, metrics={"test_pearson": value})
    expected = r"models\.1\.metrics\.test_pearson: Input should be a finite number \(model toy-b\)$"
    with pytest.raises(ModelLoadError, match=expected), app_client(artifacts, toy=True):
        pass


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ("name", r"models\.1\.name: .*\(model toy\\u202eb\)$"),  # the schema's error
        ("file", r"^model toy-b: model file toy\\u202eb is missing$"),  # the registry's
    ],
)
def test_a_bidi_control_in_a_name_or_file_is_escaped_in_the_error(tmp_path, field, expected):
    artifacts, _ = _artifacts_with(tmp_path, **{field: "toy\u202eb"})
    with pytest.raises(ModelLoadError, match=expected) as error, app_client(artifacts, toy=True):
        pass
    assert "\u202e" not in str(error.value)
