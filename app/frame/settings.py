"""Service settings, read from `MNEMO_*` environment variables (pydantic-settings)."""

from __future__ import annotations

import difflib
import math
import os
import re
import resource
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_ARTIFACTS_DIR = Path(__file__).resolve().parents[2] / "artifacts"
DEFAULT_STATE_URL = f"sqlite://{Path(__file__).resolve().parents[2] / 'state' / 'students.db'}"
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpu")  # cgroup v1 (older nodes, e.g. Amazon Linux 2): cpu.cfs_quota_us
# MNEMO_* variables that are not service settings: training data, tests, compose and image builds
OTHER_VARIABLES = {"DATA_DIR", "TEST_ARTIFACTS_DIR", "CHROMIUM", "HOST_PORT", "GPU_HOST_PORT", "BASE_IMAGE"}
# what Kubernetes sets for the Services mnemo and mnemo-redis (service links): MNEMO_SERVICE_HOST, ...
SERVICE_LINK = re.compile(r"(\w+_)?(SERVICE_HOST|SERVICE_PORT(_\w+)?|PORT_\d+_(TCP|UDP|SCTP)(_\w+)?)")
ORIGIN = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s?#]+")
SERVICE_LINK_URL = re.compile(r"(tcp|udp|sctp)://")


def read_keys_file(path: Path) -> list[str]:
    """The API keys of a keys file: one per line, blank lines and `#` comments ignored."""
    try:
        text = path.read_text()
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror}") from None
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return [line for line in lines if line]


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """One line per MNEMO_* variable that is no setting (a typo such as MNEMO_MAX_BACTH), naming the nearest one."""
    fields = {name.upper() for name in Settings.model_fields}
    lines = []
    for variable, value in sorted(environ.items()):
        name = variable.upper().removeprefix("MNEMO_")
        if not variable.upper().startswith("MNEMO_") or name in fields or name in OTHER_VARIABLES:
            continue
        if SERVICE_LINK.fullmatch(name) or (name.endswith("PORT") and SERVICE_LINK_URL.match(value)):
            continue
        nearest = difflib.get_close_matches(name, fields, n=1, cutoff=0.6)
        hint = f" (did you mean MNEMO_{nearest[0]}?)" if nearest else ""
        lines.append(f"{variable} is not a setting{hint}: ignored (the settings: README.md, Configuration)")
    return lines


def split_list(text: str) -> list[str]:
    """The non-empty entries of a comma-separated setting."""
    return [entry.strip() for entry in text.split(",") if entry.strip()]


RESERVED_FILE_HANDLES = 128  # for the models, logs, the listener, the store and the probe process


def open_files_limit() -> int | None:
    """The soft limit on open files (`ulimit -n`); None when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def default_max_connections() -> int:
    """Open connections that leave file handles for models, logs and the listener: the soft limit minus 128."""
    limit = open_files_limit()
    return 4096 if limit is None else max(16, min(4096, limit - RESERVED_FILE_HANDLES))


def cpu_quota(cpu_max: Path = CGROUP_CPU_MAX, v1_dir: Path = CGROUP_V1_CPU) -> float | None:
    """The cgroup's CPU quota in CPUs: cgroup v2's cpu.max, else v1's cfs quota / period; None when unlimited."""
    try:
        quota, period = cpu_max.read_text().split()
    except (OSError, ValueError):
        try:
            quota = (v1_dir / "cpu.cfs_quota_us").read_text().strip()
            period = (v1_dir / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            return None
    try:
        return None if quota in ("max", "-1") else int(quota) / int(period)
    except (ValueError, ZeroDivisionError):
        return None


def usable_cpus(cpu_max: Path = CGROUP_CPU_MAX, v1_dir: Path = CGROUP_V1_CPU) -> int:
    """CPUs this process may really use: its affinity mask, capped by the cgroup's CPU quota (v2 or v1)."""
    cpus = len(os.sched_getaffinity(0))
    quota = cpu_quota(cpu_max, v1_dir)
    if quota is not None:
        cpus = min(cpus, max(1, math.floor(quota)))
    return max(1, cpus)


class Settings(BaseSettings):
    """Every setting of the service; each is documented in the README's configuration table."""

    model_config = SettingsConfigDict(env_prefix="MNEMO_", extra="ignore")

    artifacts_dir: Path = Field(DEFAULT_ARTIFACTS_DIR, description="directory holding manifest.json and the models")
    host: str = Field(
        "127.0.0.1", min_length=1, pattern=r"^\S+$", description="interface to listen on (0.0.0.0 in the container)"
    )
    port: int = Field(8000, ge=1, le=65535)
    probe_port: int | None = Field(
        None, ge=1, le=65535, description="also serve /health and /ready here, from a child process (unset: main port)"
    )
    provider: Literal["auto", "cpu", "cuda", "tensorrt"] = Field(
        "auto", description="ONNX Runtime execution provider; auto = CUDA when available, else CPU"
    )
    workers: int = Field(1, ge=1, le=256, description="server processes on the port, each with every model")
    worker_stall_s: float = Field(
        30.0, ge=2, le=3600, description="a serving worker silent this long (event loop stuck) is killed and replaced"
    )
    intra_op_threads: int = Field(1, ge=1, le=256, description="ONNX Runtime threads per run (at most 256)")
    concurrent_runs: int | None = Field(
        None, ge=1, description="ONNX runs at once over all models, per worker; default CPUs // (workers x threads)"
    )
    cpu_arena: bool = Field(False, description="ONNX Runtime's CPU memory arena: faster large runs, memory kept")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["text", "json"] = "text"
    max_body_bytes: int = Field(
        1_048_576, ge=1024, le=67_108_864, description="larger request bodies get 413 (at most 64 MiB)"
    )
    on_model_error: Literal["exit", "skip"] = Field(
        "exit", description="a missing or tampered model: exit at startup, or skip it and report it not ready"
    )
    max_batch: int = Field(32, ge=1, le=4096, description="rows (pairs, histories) per ONNX run")
    max_wait_ms: float = Field(2.0, ge=0, le=1000, description="how long a batch may wait to fill while busy")
    max_queue: int = Field(512, ge=1, le=1_000_000, description="rows a model may hold admitted; beyond it 429")
    request_timeout_s: float = Field(10.0, gt=0, le=3600, description="deadline of a request; past it 504")
    drain_s: float = Field(15.0, ge=0, le=3600, description="on SIGTERM, time to finish admitted requests")
    # Connections (uvicorn's limits, app/server.py; nginx in front has the rest, deploy/nginx/nginx.conf) and logs
    keep_alive_s: float = Field(5.0, gt=0, le=600, description="idle time allowed between requests on a connection")
    body_timeout_s: float = Field(10.0, gt=0, le=600, description="longest pause while a request body arrives")
    max_header_bytes: int = Field(65_536, ge=1024, le=16_777_216, description="request line and headers; beyond 400")
    max_connections: int = Field(
        default_factory=default_max_connections,
        ge=1,
        le=1_000_000,
        description="open connections; beyond them a 503 and close (at most the open-file limit minus 128)",
    )
    error_log_window_s: float = Field(60.0, ge=0, description="a distinct error's traceback is logged once per window")
    # Access control (app/frame/access.py)
    api_keys: SecretStr | None = Field(None, description="comma-separated API keys; set, Bearer auth is required")
    api_keys_file: Path | None = Field(None, description="file with one API key per line (# comments)")
    open_paths: str = Field(
        "/health,/ready,/v2/health/live,/v2/health/ready", description="comma-separated paths that need no API key"
    )
    cors_origins: str = Field("", description="comma-separated origins allowed by CORS (* for any); empty = off")

    @field_validator("provider", "log_level", "log_format", "on_model_error", mode="before")
    @classmethod
    def _choice_in_any_case(cls, value: object) -> object:
        """`MNEMO_LOG_LEVEL=INFO` means info: the choices are matched without regard to case or spaces."""
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("api_keys")
    @classmethod
    def _keys_are_keys(cls, keys: SecretStr | None) -> SecretStr | None:
        """Blank is unset (no authentication); anything else must hold a key, never turn authentication off."""
        if keys is None or not keys.get_secret_value().strip():
            return None
        if not split_list(keys.get_secret_value()):
            raise ValueError("holds no API key (comma-separated keys); leave it empty to turn authentication off")
        return keys

    @field_validator("open_paths")
    @classmethod
    def _paths_are_paths(cls, paths: str) -> str:
        """An entry without the leading / (`health`) never matched: probes got 401 with authentication on."""
        wrong = [path for path in split_list(paths) if not path.startswith("/")]
        if wrong:
            raise ValueError(f"{wrong[0]!r} is not a path (comma-separated paths such as /health)")
        return paths

    @field_validator("cors_origins")
    @classmethod
    def _origins_are_origins(cls, origins: str) -> str:
        """Browsers send scheme://host[:port]: `example.com` or `https://example.com/` never matched, without a word."""
        wrong = [origin for origin in split_list(origins) if origin != "*" and not ORIGIN.fullmatch(origin)]
        if wrong:
            raise ValueError(f"{wrong[0]!r} is not an origin (comma-separated, such as https://example.com:8443, or *)")
        return origins

    @field_validator("api_keys_file")
    @classmethod
    def _keys_file_has_keys(cls, path: Path | None) -> Path | None:
        if path is not None and not read_keys_file(path):
            raise ValueError(f"{path} holds no API key (one per line)")
        return path

    state_url: str = Field(
        DEFAULT_STATE_URL,
        description="per-student state store: sqlite:///path/to/file.db (default: state/students.db in the "
        "project) or redis://host:port/db",
    )

    @model_validator(mode="after")
    def _probe_port_is_another_port(self) -> Settings:
        if self.probe_port is not None and self.probe_port == self.port:
            raise ValueError(f"MNEMO_PROBE_PORT ({self.probe_port}) must differ from MNEMO_PORT")
        return self

    @model_validator(mode="after")
    def _connections_fit_the_open_files_limit(self) -> Settings:
        """Past the open-file limit, accept() fails and new connections wait unanswered instead of a 503."""
        limit = open_files_limit()
        chosen = "max_connections" in self.model_fields_set  # the default already fits (at least 16)
        if chosen and limit is not None and self.max_connections > limit - RESERVED_FILE_HANDLES:
            raise ValueError(
                f"MNEMO_MAX_CONNECTIONS ({self.max_connections}) needs {self.max_connections + RESERVED_FILE_HANDLES} "
                f"open files, past this process's limit of {limit} (ulimit -n): raise the limit or lower the setting"
            )
        return self

    @model_validator(mode="after")
    def _thread_budget(self) -> Settings:
        """workers x concurrent runs x intra-op threads must fit the CPUs (GPU runs are not CPU-bound).

        By default each worker gets an equal share of the CPUs: CPUs // (workers x intra-op threads) runs.
        """
        cpus = usable_cpus()
        chosen = self.concurrent_runs is not None or self.workers > 1  # else one run, even of more threads than CPUs
        if self.concurrent_runs is None:
            self.concurrent_runs = max(1, cpus // (self.workers * self.intra_op_threads))
        threads = self.workers * self.concurrent_runs * self.intra_op_threads
        if chosen and self.provider in ("auto", "cpu") and threads > cpus:
            workers = f"MNEMO_WORKERS ({self.workers}) x " if self.workers > 1 else ""
            raise ValueError(
                f"{workers}MNEMO_CONCURRENT_RUNS ({self.concurrent_runs}) x MNEMO_INTRA_OP_THREADS "
                f"({self.intra_op_threads}) exceeds the {cpus} CPUs this process may use"
            )
        return self
