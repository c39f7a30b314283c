"""Service settings, read from `MNEMO_*` environment variables (pydantic-settings)."""

from __future__ import annotations

import contextlib
import difflib
import os
import re
import resource
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_ARTIFACTS_DIR = Path(__file__).resolve().parents[2] / "artifacts"
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpu")  # cgroup v1 (older nodes, e.g. Amazon Linux 2): cpu.cfs_quota_us
RESERVED_FILE_HANDLES = 128  # for the models, logs, the listener, the store and the probe process
# MNEMO_* variables that are not service settings: training data, tests, compose and image builds
OTHER_VARIABLES = {
    *("DATA_DIR", "TEST_ARTIFACTS_DIR", "CHROMIUM", "BASE_IMAGE"),
    *("HOST_PORT", "GPU_HOST_PORT", "GRPC_HOST_PORT", "GPU_GRPC_HOST_PORT"),
}
# what Kubernetes sets for the Services mnemo and mnemo-redis (service links): MNEMO_SERVICE_HOST, ...
SERVICE_LINK = re.compile(r"(\w+_)?(SERVICE_HOST|SERVICE_PORT(_\w+)?|PORT_\d+_(TCP|UDP|SCTP)(_\w+)?)")
SERVICE_LINK_URL = re.compile(r"(tcp|udp|sctp)://")


def read_keys_file(path: Path) -> list[str]:
    """The API keys of a keys file: one per line, blank lines and `#` comments ignored, a byte order mark skipped."""
    try:
        lines = [line.split("#", 1)[0].strip() for line in path.read_text("utf-8-sig").splitlines()]
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"cannot read {path}: {getattr(error, 'strerror', None) or 'not UTF-8 text'}") from None
    return sendable_keys([line for line in lines if line], f"in {path}")


def sendable_keys(keys: list[str], where: str) -> list[str]:
    """`keys`, when each is printable ASCII: no client can send another in a header (the error shows no key)."""
    for number, key in enumerate(keys, 1):
        if not re.fullmatch("[ -~]+", key):
            raise ValueError(f"API key {number} {where} holds a control or non-ASCII character: no client can send it")
    return keys


def unknown_variables(environ: Mapping[str, str]) -> Iterator[str]:
    """One line per MNEMO_* variable that is no setting (a typo such as MNEMO_MAX_BACTH), naming the nearest one."""
    fields = {name.upper() for name in Settings.model_fields}
    for variable, value in sorted(environ.items()):
        name = variable.upper().removeprefix("MNEMO_")
        link = SERVICE_LINK.fullmatch(name) or (name.endswith("PORT") and SERVICE_LINK_URL.match(value))
        if name == variable.upper() or name in fields | OTHER_VARIABLES or link:  # not MNEMO_*, or not a typo
            continue
        nearest = difflib.get_close_matches(name, fields, n=1, cutoff=0.6)
        hint = f" (did you mean MNEMO_{nearest[0]}?)" if nearest else ""
        yield f"{variable} is not a setting{hint}: ignored (the settings: docs/configuration.md)"


def split_list(text: str) -> list[str]:
    """The non-empty entries of a comma-separated setting."""
    return [entry.strip() for entry in text.split(",") if entry.strip()]


def entries(pattern: str, what: str, required: bool = False) -> AfterValidator:
    """A comma-separated setting whose every entry matches `pattern` (at least one when `required`), its entries
    joined: an entry that could never match (`cpu,cdua`, `health`) stops startup, naming it."""

    def check(text: str) -> str:
        listed = split_list(text)
        wrong = [entry for entry in listed if not re.fullmatch(pattern, entry, re.DOTALL)]
        if wrong or (required and not listed):
            raise ValueError(f"{(wrong or [text])[0]!r} is not {what}")
        return ",".join(listed)

    return AfterValidator(check)


ANY_CASE = BeforeValidator(lambda value: value.strip().lower() if isinstance(value, str) else value)  # of choices
BLANK_IS_UNSET = BeforeValidator(lambda value: (value.strip() or None) if isinstance(value, str) else value)
PROVIDERS = entries("auto|cpu|cuda|tensorrt", "a provider (comma-separated: auto, cpu, cuda, tensorrt)", required=True)
DEVICE_IDS = entries(r"\d+", "a CUDA device id (an integer such as 0, or comma-separated: 0,1)", required=True)
PATHS = entries("/.*", "a path (comma-separated paths such as /health)")
ORIGIN = r"\*|[a-zA-Z][a-zA-Z0-9+.-]*://[A-Za-z0-9._~%:\[\]-]+"  # as browsers send it: scheme://host[:port], ASCII
ORIGINS = entries(ORIGIN, "an origin (comma-separated, such as https://example.com:8443, or *; IDN hosts as xn--)")


def open_files_limit() -> int:
    """The soft limit on open files (`ulimit -n`); sys.maxsize when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return sys.maxsize if soft == resource.RLIM_INFINITY else soft


def usable_cpus(cpu_max: Path = CGROUP_CPU_MAX, v1_dir: Path = CGROUP_V1_CPU) -> int:
    """CPUs this process may use: its affinity mask, capped by the cgroup's CPU quota (v2's cpu.max, else v1's)."""
    cpus = len(os.sched_getaffinity(0))
    for files in ([cpu_max], [v1_dir / "cpu.cfs_quota_us", v1_dir / "cpu.cfs_period_us"]):
        with contextlib.suppress(OSError, ValueError, ZeroDivisionError):
            quota, period = " ".join(file.read_text() for file in files).split()
            return cpus if quota in ("max", "-1") else max(1, min(cpus, int(quota) // int(period)))
    return cpus


class Settings(BaseSettings):
    """Every setting of the service, each an `MNEMO_*` environment variable (docs/configuration.md, generated)."""

    model_config = SettingsConfigDict(
        env_prefix="MNEMO_",
        extra="ignore",
        use_attribute_docstrings=True,
        allow_inf_nan=False,  # nan passes no bound
    )

    artifacts_dir: Path = DEFAULT_ARTIFACTS_DIR
    """Directory of `manifest.json`, the ONNX files and their assets, each checked against its sha256 at startup."""
    host: str = Field("127.0.0.1", min_length=1, pattern=r"^[!-~]+$")
    """Interface to listen on (`0.0.0.0` in the container image): an IP address or an ASCII (xn--) host name."""
    port: int = Field(8000, ge=1, le=65535)
    """Port to listen on."""
    models: str = ""
    """Comma-separated manifest models to serve (empty: all); a name the manifest lacks stops startup, naming them."""
    probe_port: int | None = Field(None, ge=1, le=65535)
    """Also answer `GET /health` and `GET /ready` on this port from a child process, even while the app is busy."""
    grpc_port: int | None = Field(None, ge=1, le=65535)
    """Also serve the Open Inference Protocol over gRPC on this port; unset, gRPC is off."""
    provider: Annotated[str, ANY_CASE, PROVIDERS] = "auto"
    """ONNX Runtime execution providers, comma-separated: `cpu`, `cuda`, `tensorrt` or `auto` (CUDA if offered, else
    CPU); `cuda,cpu` serves each model from both, each batch on the one predicted to finish first (docs/engine.md)."""
    workers: int = Field(1, ge=1, le=256)
    """Server processes on the port, each with every model; on CPU, workers x concurrent runs x threads fit the CPUs."""
    worker_stall_s: float = Field(30.0, ge=2, le=3600)
    """A worker whose event loop has not reported to gunicorn's master for this long is killed and replaced."""
    intra_op_threads: int = Field(1, ge=1, le=256)
    """ONNX Runtime threads per run; these graphs are many small steps: one thread leaves the other CPUs to others."""
    concurrent_runs: int | None = Field(None, ge=1)
    """ONNX runs at once per worker. Unset: usable CPUs (affinity, cgroup quota) // (workers x intra-op threads)."""
    cpu_arena: bool = False
    """ONNX Runtime's CPU memory arena: faster large runs, but it keeps the memory of the largest run for good."""
    cuda_device_id: Annotated[str, DEVICE_IDS] = "0"
    """CUDA device id, or comma-separated ids: worker i runs on the i-th id, modulo their number (docs/gpu.md)."""
    cuda_tf32: bool = False
    """TF32 matrix products on CUDA (ONNX Runtime's `use_tf32`): faster, but far from CPU parity (docs/gpu.md)."""
    cuda_mem_limit_mb: Annotated[int | None, BLANK_IS_UNSET] = Field(None, ge=1)  # a config map's empty value
    """Bound of each CUDA session's memory arena in MiB (`gpu_mem_limit`); a larger run is split (docs/gpu.md)."""
    cuda_arena_extend_strategy: Literal["kSameAsRequested", "kNextPowerOfTwo"] = "kSameAsRequested"
    """How the CUDA arena grows: by what a run asks (the least memory) or in powers of two (ONNX Runtime's default)."""
    cuda_conv_algo_search: Literal["HEURISTIC", "EXHAUSTIVE", "DEFAULT"] = "HEURISTIC"
    """cuDNN's convolution algorithm search; `EXHAUSTIVE` benchmarks every new input shape (batch size) again."""
    log_level: Annotated[Literal["debug", "info", "warning", "error"], ANY_CASE] = "info"
    """Lowest level logged. Choices match in any case, as for every setting with choices."""
    log_format: Annotated[Literal["text", "json"], ANY_CASE] = "text"
    """`text`, or `json` for one JSON object per line (uvicorn's own lines included)."""
    max_body_bytes: int = Field(1_048_576, ge=1024, le=67_108_864)
    """Request bodies larger than this get 413."""
    on_model_error: Annotated[Literal["exit", "skip"], ANY_CASE] = "exit"
    """A missing or tampered model file: `exit` stops startup, naming it; `skip` serves the rest, that one not ready."""
    max_batch: int = Field(32, ge=1, le=4096)
    """Most rows (sentence pairs, history chunks) per ONNX run; within it, runs are sized by cost (docs/engine.md)."""
    max_wait_ms: float = Field(2.0, ge=0, le=1000)
    """While a run of the model is in flight, how long the next batch may wait to fill. An idle model never waits."""
    max_queue: int = Field(512, ge=1, le=1_000_000)
    """Rows a model may hold admitted (queued or running); beyond it requests get 429 with `Retry-After`."""
    request_timeout_s: float = Field(10.0, gt=0, le=3600)
    """A request's deadline, from its arrival; past it the answer is 504 and its unstarted work is dropped."""
    drain_s: float = Field(15.0, ge=0, le=3600)
    """On SIGTERM, SIGINT or SIGHUP, how long admitted requests may take to finish before the process exits."""
    keep_alive_s: float = Field(5.0, gt=0, le=600)
    """Idle time allowed on a kept-alive connection between requests."""
    header_timeout_s: float = Field(10.0, gt=0, le=600)
    """Time a request's line and headers may take from the connection's opening or the request's start (and the rest
    of a body its route left unread, from the answer), else close."""
    body_timeout_s: float = Field(10.0, gt=0, le=600)
    """Longest pause while a body arrives, else 408; the whole body must also arrive by the request's deadline."""
    max_header_bytes: int = Field(65_536, ge=1024, le=16_777_216)
    """Request line and headers; larger get 400 and a close."""
    max_connections: int = Field(
        default_factory=lambda: min(4096, max(16, open_files_limit() - RESERVED_FILE_HANDLES)), ge=1, le=1_000_000
    )
    """Open connections; one more is answered 503 and closed (on `MNEMO_GRPC_PORT`: calls in flight, one more gets
    `RESOURCE_EXHAUSTED`). Default: the open-file limit (`ulimit -n`) minus 128, at most 4096; more stops startup."""
    error_log_window_s: float = Field(60.0, ge=0)
    """A distinct unexpected error's traceback is logged once per window; each occurrence still logs one line."""
    api_keys: Annotated[SecretStr | None, BLANK_IS_UNSET] = None
    """Comma-separated API keys; set (or `MNEMO_API_KEYS_FILE`), every request but the open paths needs `Authorization:
    Bearer <key>`. Empty is unset; a value without any key (`,`) stops startup rather than turn authentication off."""
    api_keys_file: Annotated[Path | None, BLANK_IS_UNSET] = None
    """File with one API key per line (`#` comments); empty is unset; a file without keys stops startup."""
    open_paths: Annotated[str, PATHS] = "/health,/ready,/v2/health/live,/v2/health/ready"
    """Comma-separated paths served without an API key (the docs and the explorer always are; add `/metrics`)."""
    cors_origins: Annotated[str, ORIGINS] = ""
    """Comma-separated origins allowed by CORS (`scheme://host[:port]` as browsers send it), `*` for any; empty: off."""
    state_url: str = f"sqlite://{DEFAULT_ARTIFACTS_DIR.parent / 'state' / 'students.db'}"
    """Per-student state store: `sqlite:///path/to/file.db` (embedded) or `redis://host:port/db` (several replicas;
    the `redis` extra, a server with `appendonly yes` and `appendfsync always`). See docs/students.md."""

    @field_validator("api_keys", "api_keys_file")
    @classmethod
    def _holds_keys(cls, value: SecretStr | Path | None) -> SecretStr | Path | None:
        """Set (not blank), each must hold a key: `,` or a file without keys never turns authentication off."""
        if isinstance(value, Path) and not read_keys_file(value):
            raise ValueError(f"{value} holds no API key (one per line)")
        if isinstance(value, SecretStr) and not sendable_keys(split_list(value.get_secret_value()), "of the list"):
            raise ValueError("holds no API key (comma-separated keys); leave it empty to turn authentication off")
        return value

    @model_validator(mode="after")
    def _rules_across_settings(self) -> Settings:
        """Distinct ports; connections within the open-file limit (past it, accept() fails and a new connection waits
        unanswered instead of a 503); workers x concurrent runs x intra-op threads within the CPUs (not GPU runs)."""
        if self.probe_port == self.port:
            raise ValueError(f"MNEMO_PROBE_PORT ({self.probe_port}) must differ from MNEMO_PORT")
        if self.grpc_port is not None and self.grpc_port in (self.port, self.probe_port):
            raise ValueError(f"MNEMO_GRPC_PORT ({self.grpc_port}) must differ from MNEMO_PORT and MNEMO_PROBE_PORT")
        limit, needed = open_files_limit(), self.max_connections + RESERVED_FILE_HANDLES
        if "max_connections" in self.model_fields_set and needed > limit:  # a default fits
            raise ValueError(
                f"MNEMO_MAX_CONNECTIONS ({self.max_connections}) needs {needed} open files, past this process's "
                f"limit of {limit} (ulimit -n): raise the limit or lower the setting"
            )
        cpus = usable_cpus()
        chosen = self.concurrent_runs is not None or self.workers > 1  # else one run, even of more threads than CPUs
        if self.concurrent_runs is None:
            self.concurrent_runs = max(1, cpus // (self.workers * self.intra_op_threads))
        threads = self.workers * self.concurrent_runs * self.intra_op_threads
        if chosen and {"auto", "cpu"} & set(split_list(self.provider)) and threads > cpus:
            workers = f"MNEMO_WORKERS ({self.workers}) x " if self.workers > 1 else ""
            raise ValueError(
                f"{workers}MNEMO_CONCURRENT_RUNS ({self.concurrent_runs}) x MNEMO_INTRA_OP_THREADS "
                f"({self.intra_op_threads}) exceeds the {cpus} CPUs this process may use"
            )
        return self

    def address(self, port: int) -> str:
        """`host:port` as a bind address and a URL write it: an IPv6 host in brackets."""
        return f"[{self.host}]:{port}" if ":" in self.host else f"{self.host}:{port}"
