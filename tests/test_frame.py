"""The serving frame: providers, verified registry, operations endpoints, limits, errors, metrics."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import onnxruntime as ort
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.providers import ProviderUnavailable, resolve_provider
from app.registry import ModelLoadError
from app.settings import Settings, usable_cpus
from tests.conftest import KT_MODEL, SIM_MODEL, manifest_models

ROOT = Path(__file__).resolve().parents[1]


def _settings(artifacts: Path, **overrides) -> Settings:
    return Settings(artifacts_dir=artifacts, intra_op_threads=1, **{"provider": "cpu", **overrides})


# -- providers: every branch with the real onnxruntime of this CPU machine -------------------------
def test_auto_uses_cpu_here_and_models_report_the_provider_in_use(client):
    assert "CUDAExecutionProvider" not in ort.get_available_providers()
    assert resolve_provider("auto") == "CPUExecutionProvider"
    models = client.get("/models").json()["models"]
    assert {m["provider"] for m in models} == {"CPUExecutionProvider"}


def test_auto_would_prefer_cuda_when_onnxruntime_offers_it():
    assert resolve_provider("auto", ["CUDAExecutionProvider", "CPUExecutionProvider"]) == "CUDAExecutionProvider"


@pytest.mark.parametrize(("provider", "named"), [("cuda", "CUDAExecutionProvider"), ("tensorrt", "Tensorrt")])
def test_unavailable_provider_fails_startup_naming_it_and_the_available_ones(tiny_artifacts, provider, named):
    with pytest.raises(ProviderUnavailable, match=f"{named}.*CPUExecutionProvider"):
        resolve_provider(provider)
    app = create_app(_settings(tiny_artifacts, provider=provider))
    with pytest.raises(ProviderUnavailable, match=named), TestClient(app):
        pass


def test_serving_with_cuda_on_this_machine_exits_with_one_clear_message(tmp_path):
    (tmp_path / "manifest.json").write_text('{"schema_version": 1, "models": []}')
    env = {**os.environ, "MNEMO_PROVIDER": "cuda", "MNEMO_ARTIFACTS_DIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "app"], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert result.returncode != 0
    assert "CUDAExecutionProvider" in result.stderr and "MNEMO_PROVIDER=cuda" in result.stderr


def test_thread_default_follows_the_cgroup_quota(tmp_path):
    quota = tmp_path / "cpu.max"
    quota.write_text("100000 100000\n")
    assert usable_cpus(quota) == 1
    quota.write_text("max 100000\n")
    assert usable_cpus(quota) == len(os.sched_getaffinity(0))


# -- registry: verification, not-ready handling, empty manifest -----------------------------------
def test_tampered_model_stops_startup_by_default(artifacts_copy):
    onnx_file = artifacts_copy / f"{KT_MODEL}.onnx"
    onnx_file.write_bytes(onnx_file.read_bytes() + b"\0")
    with pytest.raises(ModelLoadError, match=f"{KT_MODEL}.*sha256"), TestClient(create_app(_settings(artifacts_copy))):
        pass


def test_tampered_asset_is_never_served_in_skip_mode(artifacts_copy):
    asset = artifacts_copy / f"{KT_MODEL}.mv0.npy"
    asset.write_bytes(asset.read_bytes()[:-4] + b"\1\1\1\1")
    with TestClient(create_app(_settings(artifacts_copy, on_model_error="skip"))) as client:
        assert client.get("/health").status_code == 200
        ready = client.get("/ready")
        assert ready.status_code == 503 and KT_MODEL in ready.json()["detail"]
        listed = {m["name"]: m for m in client.get("/models").json()["models"]}
        assert listed[KT_MODEL]["ready"] is False and "sha256" in listed[KT_MODEL]["error"]
        response = client.post("/knowledge-trace", json={"interactions": [{"question": 1, "correct": True}]})
        assert response.status_code == 503
        assert client.post("/similarity", json={"sentence_a": "a dog", "sentence_b": "a cat"}).status_code == 200


def test_missing_model_file_is_a_clear_error(artifacts_copy):
    (artifacts_copy / f"{SIM_MODEL}.onnx").unlink()
    with pytest.raises(ModelLoadError, match="missing"), TestClient(create_app(_settings(artifacts_copy))):
        pass


def test_empty_manifest_is_ready_and_task_endpoints_say_no_model(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"schema_version": 1, "models": []}))
    with TestClient(create_app(_settings(tmp_path))) as client:
        assert client.get("/ready").status_code == 200
        assert client.get("/models").json() == {"models": []}
        response = client.post("/similarity", json={"sentence_a": "a", "sentence_b": "b"})
        assert response.status_code == 404 and "No similarity model" in response.json()["detail"]


# -- operations endpoints, request ids, limits, metrics --------------------------------------------
def test_models_lists_every_model_with_task_limits_and_metrics(client, tiny_artifacts):
    listed = {m["name"]: m for m in client.get("/models").json()["models"]}
    assert set(listed) == {m["name"] for m in manifest_models(tiny_artifacts)}
    assert listed[KT_MODEL]["task"] == "knowledge-trace"
    assert listed[KT_MODEL]["n_questions"] == 50 and listed[KT_MODEL]["n_concepts"] == 5
    assert listed[SIM_MODEL]["task"] == "similarity" and listed[SIM_MODEL]["max_tokens"] == 64
    assert "test_pearson" in listed[SIM_MODEL]["metrics"] and "test_auc" in listed[KT_MODEL]["metrics"]
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/ready").status_code == 200


def test_every_response_has_a_request_id_and_keeps_a_sane_incoming_one(client):
    assert len(client.get("/health").headers["x-request-id"]) == 32
    assert client.get("/health", headers={"X-Request-ID": "abc-123"}).headers["x-request-id"] == "abc-123"
    assert client.get("/nope").headers["x-request-id"]


def test_body_over_the_limit_is_413_and_the_service_keeps_serving(client):
    big = {"sentence_a": "word " * 300_000, "sentence_b": "b"}
    response = client.post("/similarity", json=big)
    assert response.status_code == 413 and "MNEMO_MAX_BODY_BYTES" in response.json()["detail"]

    def chunks():
        yield b'{"sentence_a": "'
        for _ in range(40):
            yield b"x" * 50_000
        yield b'", "sentence_b": "b"}'

    streamed = client.post("/similarity", content=chunks(), headers={"content-type": "application/json"})
    assert streamed.status_code == 413
    assert client.get("/health").status_code == 200


@pytest.mark.parametrize("body", [b"{not json", b"[]", b'"text"', b"null", b""])
def test_malformed_bodies_are_422_never_500(client, body):
    for path in ("/similarity", "/similarity/batch", "/knowledge-trace"):
        response = client.post(path, content=body, headers={"content-type": "application/json"})
        assert response.status_code == 422, (path, body, response.text)


def test_metrics_count_requests_by_route_and_status_and_time_inference(client):
    client.post("/similarity", json={"sentence_a": "a man", "sentence_b": "a woman"})
    client.post("/similarity", json={"sentence_a": "", "sentence_b": "a woman"})
    text = client.get("/metrics").text
    assert 'mnemo_http_requests_total{method="POST",route="/similarity",status="200"}' in text
    assert 'mnemo_http_requests_total{method="POST",route="/similarity",status="422"}' in text
    assert 'mnemo_http_request_duration_seconds_bucket{le="0.001",method="POST",route="/similarity"}' in text
    assert f'mnemo_inference_duration_seconds_count{{model="{SIM_MODEL}"}}' in text


def test_openapi_documents_every_endpoint_with_examples(client):
    schema = client.get("/openapi.json").json()
    assert {"/similarity", "/similarity/batch", "/knowledge-trace", "/health", "/ready", "/models", "/metrics"} <= set(
        schema["paths"]
    )
    for name in ("SimilarityRequest", "SimilarityBatchRequest", "KnowledgeTraceRequest"):
        assert schema["components"]["schemas"][name]["examples"]
    assert client.get("/docs").status_code == 200


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_real_uvicorn_process_serves_ready_and_stops_on_sigterm(tiny_artifacts):
    port = _free_port()
    env = {
        **os.environ,
        "MNEMO_ARTIFACTS_DIR": str(tiny_artifacts),
        "MNEMO_PORT": str(port),
        "MNEMO_PROVIDER": "cpu",
        "MNEMO_LOG_FORMAT": "json",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "app"], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.3)
        else:
            pytest.fail("uvicorn never became ready")
        response = httpx.post(
            f"http://127.0.0.1:{port}/knowledge-trace",
            json={"interactions": [{"question": 3, "correct": True}], "next_questions": [4]},
        )
        assert response.status_code == 200 and response.json()["model"] == KT_MODEL
    finally:
        process.terminate()
        output, _ = process.communicate(timeout=30)
    assert "Application shutdown complete" in output  # graceful: uvicorn handled SIGTERM
    assert process.returncode in (0, -15)  # uvicorn re-raises the signal after a clean shutdown
    access_lines = [json.loads(line) for line in output.splitlines() if '"mnemo.access"' in line]
    assert any(line["path"] == "/knowledge-trace" and line["status"] == 200 for line in access_lines)
