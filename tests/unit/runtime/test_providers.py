"""Provider selection, every branch with the real onnxruntime of this CPU machine, and the thread default."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import onnxruntime as ort
import pytest

from app.core.settings import Settings, usable_cpus
from app.runtime.providers import ProviderUnavailable, check_session_provider, resolve_provider, session_providers
from tests.helpers import app_client, run_app
from tests.toy_model import build_toy_onnx, write_empty_manifest

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
    assert resolve_provider("auto", ["CUDAExecutionProvider", CPU]) == "CUDAExecutionProvider"
    assert session_providers("CUDAExecutionProvider") == ["CUDAExecutionProvider", CPU]


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
    """onnxruntime's silent fallback, for real: ask a CPU-only session to be CUDA's."""
    session = ort.InferenceSession(str(build_toy_onnx(tmp_path / "toy.onnx")), providers=[CPU])
    assert check_session_provider(session, CPU, "toy") == CPU
    with pytest.raises(ProviderUnavailable, match=f"toy: asked for CUDAExecutionProvider but .* on {CPU}"):
        check_session_provider(session, "CUDAExecutionProvider", "toy")


def _environment(artifacts: Path, **env: str) -> dict[str, str]:
    return {**os.environ, "MNEMO_ARTIFACTS_DIR": str(artifacts), **env}


@pytest.mark.slow
def test_python_m_app_with_cuda_exits_with_one_clear_line(tmp_path):
    result = run_app(_environment(write_empty_manifest(tmp_path), MNEMO_PROVIDER="cuda"), timeout=120)
    assert result.returncode == 3  # gunicorn's status for a worker that cannot boot: it stops, not retries
    [line] = [line for line in result.stderr.splitlines() if line.startswith("mnemo: cannot start:")]
    assert "CUDAExecutionProvider" in line and CPU in line and "Traceback" not in result.stderr


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
