"""Service settings, read from `MNEMO_*` environment variables (pydantic-settings)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_ARTIFACTS_DIR = Path(__file__).resolve().parents[1] / "artifacts"
DEFAULT_STATE_URL = f"sqlite://{Path(__file__).resolve().parents[1] / 'state' / 'students.db'}"
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def usable_cpus(cpu_max: Path = CGROUP_CPU_MAX) -> int:
    """CPUs this process may really use: its affinity mask, capped by a cgroup v2 CPU quota."""
    cpus = len(os.sched_getaffinity(0))
    try:
        quota, period = cpu_max.read_text().split()
        if quota != "max":
            cpus = min(cpus, max(1, math.floor(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cpus)


class Settings(BaseSettings):
    """Every setting of the service; each is documented in the README's configuration table."""

    model_config = SettingsConfigDict(env_prefix="MNEMO_", extra="ignore")

    artifacts_dir: Path = Field(DEFAULT_ARTIFACTS_DIR, description="directory holding manifest.json and the models")
    host: str = Field("127.0.0.1", description="interface to listen on (0.0.0.0 in the container)")
    port: int = Field(8000, ge=1, le=65535)
    provider: Literal["auto", "cpu", "cuda", "tensorrt"] = Field(
        "auto", description="ONNX Runtime execution provider; auto = CUDA when available, else CPU"
    )
    intra_op_threads: int = Field(default_factory=usable_cpus, ge=1, description="ONNX Runtime threads per session")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["text", "json"] = "text"
    max_body_bytes: int = Field(1_048_576, ge=1024, description="larger request bodies get 413")
    on_model_error: Literal["exit", "skip"] = Field(
        "exit", description="a missing or tampered model: exit at startup, or skip it and report it not ready"
    )
    state_url: str = Field(
        DEFAULT_STATE_URL,
        description="per-student state store: sqlite:///path/to/file.db (default: state/students.db in the "
        "project) or redis://host:port/db",
    )
