"""Provider selection, every branch with the real onnxruntime of this CPU machine, and the thread default."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import onnxruntime as ort
import pydantic
import pytest
from fastapi.testclient import TestClient

from app.core.settings import Settings, usable_cpus
from app.runtime.registry import ModelLoadError
from app.runtime.sessions import (
    ProviderUnavailable,
    cuda_options,
    for_worker,
    open_session,
    resolve_providers,
    session_providers,
)
from tests.helpers import app_client, app_settings, run_app
from tests.toy_model import build_toy_onnx, toy_app, write_empty_manifest

ROOT = Path(__file__).resolve().parents[3]
CPU = "CPUExecutionProvider"


def test_this_machine_offers_no_gpu_provider():
    """The premise of the tests below: onnxruntime here is the CPU build."""
    assert CPU in ort.get_available_providers()
    assert "CUDAExecutionProvider" not in ort.get_available_providers()


def test_cpu_sessions_report_the_provider_really_in_use(toy_artifacts):
    with app_client(toy_artifacts, toy=True, provider="cpu") as client:
        assert {m["provider"] for m in client.get("/models").json()["models"]} == {CPU}


def test_auto_chooses_cpu_here_and_logs_the_choice(toy_artifacts, mnemo_logs):
    with app_client(toy_artifacts, toy=True, provider="auto") as client:
        assert client.get("/ready").status_code == 200
        assert {m["provider"] for m in client.get("/models").json()["models"]} == {CPU}
    assert any(f"auto chose {CPU}" in line for line in mnemo_logs.messages("mnemo.providers"))


def test_auto_prefers_cuda_when_onnxruntime_offers_it():
    assert resolve_providers("auto", ["CUDAExecutionProvider", CPU]) == ["CUDAExecutionProvider"]
    assert resolve_providers("auto,cpu", ["CUDAExecutionProvider", CPU]) == ["CUDAExecutionProvider", CPU]
    chosen = session_providers("CUDAExecutionProvider", Settings())
    assert [name for name, _ in chosen] == ["CUDAExecutionProvider", CPU]


@pytest.mark.parametrize(
    ("provider", "named"), [("cuda", "CUDAExecutionProvider"), ("tensorrt", "TensorrtExecutionProvider")]
)
@pytest.mark.parametrize("on_model_error", ["exit", "skip"])
def test_unavailable_provider_fails_startup_naming_it_and_the_available_ones(
    toy_artifacts, provider, named, on_model_error
):
    with (
        pytest.raises(ProviderUnavailable) as raised,
        app_client(toy_artifacts, toy=True, provider=provider, on_model_error=on_model_error),
    ):
        pass
    message = str(raised.value)
    assert f"MNEMO_PROVIDER={provider}" in message and named in message and CPU in message


def test_a_session_on_another_provider_than_asked_is_refused(tmp_path):
    """onnxruntime's silent fallback, for real: this CPU-only onnxruntime opens a session asked to be CUDA's."""
    path = build_toy_onnx(tmp_path / "toy.onnx")
    assert open_session(path, Settings(), CPU).get_providers() == [CPU]
    with pytest.raises(ProviderUnavailable, match=f"toy.onnx: asked for CUDAExecutionProvider but .* on {CPU}"):
        open_session(path, Settings(), "CUDAExecutionProvider")


def test_a_silent_fallback_to_the_cpu_stops_startup_in_one_line(toy_artifacts, monkeypatch):
    """onnxruntime-gpu without the CUDA libraries lists CUDA, then creates the session on the CPU (that fallback is
    real here; only the list is onnxruntime-gpu's): startup stops with the one line `python -m app` prints."""
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", CPU])
    app = toy_app(app_settings(toy_artifacts, provider="cuda", on_model_error="skip"))
    with pytest.raises(ModelLoadError), TestClient(app):
        pass
    says = rf"model file toy-\w+\.onnx: asked for CUDAExecutionProvider but onnxruntime created the session on {CPU}"
    assert re.fullmatch(says, app.state.startup_error)


# -- the CUDA provider's options, from the MNEMO_CUDA_* settings -------------------------------------------------
def test_cuda_options_default_to_tf32_off_and_an_arena_that_grows_by_what_runs_ask():
    assert cuda_options(Settings()) == {
        "device_id": "0",
        "use_tf32": "0",
        "arena_extend_strategy": "kSameAsRequested",
        "cudnn_conv_algo_search": "HEURISTIC",
        "do_copy_in_default_stream": "1",
    }


def test_cuda_options_follow_each_setting(monkeypatch):
    monkeypatch.setenv("MNEMO_CUDA_TF32", "true")
    monkeypatch.setenv("MNEMO_CUDA_DEVICE_ID", "2")
    monkeypatch.setenv("MNEMO_CUDA_MEM_LIMIT_MB", "1536")
    monkeypatch.setenv("MNEMO_CUDA_ARENA_EXTEND_STRATEGY", "kNextPowerOfTwo")
    monkeypatch.setenv("MNEMO_CUDA_CONV_ALGO_SEARCH", "EXHAUSTIVE")
    options = cuda_options(Settings())
    assert options["use_tf32"] == "1" and options["device_id"] == "2"
    assert options["gpu_mem_limit"] == str(1536 * 1024 * 1024)
    assert options["arena_extend_strategy"] == "kNextPowerOfTwo"
    assert options["cudnn_conv_algo_search"] == "EXHAUSTIVE"


def test_a_blank_memory_limit_leaves_the_arena_unbounded(monkeypatch):
    """A config map's `MNEMO_CUDA_MEM_LIMIT_MB=` (deploy/k8s/base/mnemo.env) is unset, not an error."""
    monkeypatch.setenv("MNEMO_CUDA_MEM_LIMIT_MB", "")
    assert Settings().cuda_mem_limit_mb is None and "gpu_mem_limit" not in cuda_options(Settings())


def test_the_options_go_to_the_gpu_providers_only():
    settings = Settings(cuda_device_id="1", cuda_mem_limit_mb=64)
    assert session_providers(CPU, settings) == [(CPU, {})]
    assert session_providers("CUDAExecutionProvider", settings) == [
        ("CUDAExecutionProvider", cuda_options(settings)),
        (CPU, {}),
    ]
    tensorrt = session_providers("TensorrtExecutionProvider", settings)
    assert tensorrt == [
        ("TensorrtExecutionProvider", {"device_id": "1"}),
        ("CUDAExecutionProvider", cuda_options(settings)),
        (CPU, {}),
    ]


def test_workers_are_spread_over_the_listed_devices_round_robin():
    settings = Settings(cuda_device_id="0, 1")
    assert [cuda_options(for_worker(settings, worker))["device_id"] for worker in range(5)] == ["0", "1", "0", "1", "0"]
    assert for_worker(Settings(cuda_device_id="3"), 7).cuda_device_id == "3"


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("MNEMO_CUDA_DEVICE_ID", "0,gpu1", "is not a CUDA device id"),
        ("MNEMO_CUDA_DEVICE_ID", "-1", "is not a CUDA device id"),
        ("MNEMO_CUDA_DEVICE_ID", ",", "is not a CUDA device id"),
        ("MNEMO_CUDA_MEM_LIMIT_MB", "0", "greater than or equal to 1"),
        ("MNEMO_CUDA_ARENA_EXTEND_STRATEGY", "kDouble", "kSameAsRequested"),
        ("MNEMO_CUDA_CONV_ALGO_SEARCH", "fast", "HEURISTIC"),
        ("MNEMO_CUDA_TF32", "maybe", "valid boolean"),
    ],
)
def test_an_invalid_cuda_setting_is_an_error_naming_it(monkeypatch, variable, value, says):
    monkeypatch.setenv(variable, value)
    with pytest.raises(pydantic.ValidationError) as raised:
        Settings()
    message = str(raised.value)
    assert variable.removeprefix("MNEMO_").lower() in message and says in message


@pytest.mark.slow
def test_python_m_app_with_an_invalid_cuda_setting_exits_naming_it(tmp_path):
    environment = _environment(write_empty_manifest(tmp_path), MNEMO_CUDA_DEVICE_ID="cuda:0")
    result = run_app(environment, timeout=120)
    assert result.returncode == 1 and "MNEMO_CUDA_DEVICE_ID" in result.stderr and "Traceback" not in result.stderr


def _environment(artifacts: Path, **env: str) -> dict[str, str]:
    return {**os.environ, "MNEMO_ARTIFACTS_DIR": str(artifacts), **env}


@pytest.mark.slow
def test_python_m_app_with_cuda_exits_with_one_clear_line(tmp_path):
    result = run_app(_environment(write_empty_manifest(tmp_path), MNEMO_PROVIDER="cuda"), timeout=120)
    assert result.returncode == 3  # gunicorn's status for a worker that cannot boot: it stops, not retries
    [line] = [line for line in result.stderr.splitlines() if line.startswith("mnemo: cannot start:")]
    assert "CUDAExecutionProvider" in line and CPU in line and "Traceback" not in result.stderr
    # no other error line but gunicorn's own about the worker (uvicorn's "Application startup failed" says no more)
    assert [line for line in result.stderr.splitlines() if " ERROR " in line and "gunicorn.error" not in line] == []


@pytest.mark.slow
def test_python_m_app_with_a_bad_setting_exits_naming_it(tmp_path):
    result = run_app(_environment(write_empty_manifest(tmp_path), MNEMO_PROVIDER="gpu"), timeout=120)
    assert result.returncode == 1 and "MNEMO_PROVIDER" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_uvicorn_cli_with_cuda_exits_non_zero_naming_cuda(tmp_path):
    command = [sys.executable, "-m", "uvicorn", "app.main:app", "--port", "0"]
    environment = _environment(write_empty_manifest(tmp_path), MNEMO_PROVIDER="cuda")
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode != 0
    assert "startup failed: MNEMO_PROVIDER=cuda asks for CUDAExecutionProvider" in result.stderr


# -- thread count: the CPUs this process may use ---------------------------------------------------
def test_threads_default_to_the_affinity_mask_capped_by_the_cgroup_quota(tmp_path):
    affinity = len(os.sched_getaffinity(0))
    quota = tmp_path / "cpu.max"
    no_v1 = tmp_path / "no-v1"
    quota.write_text("100000 100000\n")
    assert usable_cpus(quota, no_v1) == 1
    quota.write_text("50000 100000\n")
    assert usable_cpus(quota, no_v1) == 1  # never below one
    quota.write_text(f"{(affinity + 4) * 100000} 100000\n")
    assert usable_cpus(quota, no_v1) == affinity  # a quota above the mask does not add CPUs
    quota.write_text("max 100000\n")
    assert usable_cpus(quota, no_v1) == affinity
    assert usable_cpus(tmp_path / "absent", no_v1) == affinity
    quota.write_text("garbage\n")
    assert usable_cpus(quota, no_v1) == affinity


def test_a_cgroup_v1_quota_caps_the_threads_too(tmp_path):
    """cgroup v1 nodes (docker --cpus 1 there: cpu.cfs_quota_us 100000) were read as unlimited."""
    affinity = len(os.sched_getaffinity(0))
    v1 = tmp_path / "cpu"
    v1.mkdir()
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    (v1 / "cpu.cfs_quota_us").write_text("100000\n")
    assert usable_cpus(tmp_path / "absent", v1) == 1
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")  # unlimited
    assert usable_cpus(tmp_path / "absent", v1) == affinity
    (v1 / "cpu.cfs_quota_us").write_text("100000\n")
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert usable_cpus(tmp_path / "cpu.max", v1) == affinity  # cgroup v2's file wins when present
    assert Settings().concurrent_runs == usable_cpus() or "MNEMO_CONCURRENT_RUNS" in os.environ
