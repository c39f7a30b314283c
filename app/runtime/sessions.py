"""ONNX Runtime sessions: the execution provider (never silently another than asked), the options from the thread
budget, and every session opened early, while the web stack imports, for a faster start."""

from __future__ import annotations

import contextlib
import logging
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import onnxruntime as ort

from app.core.integrity import verify
from app.core.manifest import confined, load_manifest
from app.core.settings import Settings, split_list, usable_cpus

logger = logging.getLogger("mnemo.providers")
PROVIDER_NAMES = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
}


class ProviderUnavailable(RuntimeError):
    """The requested execution provider cannot be used by this onnxruntime."""


def resolve_provider(requested: str, available: list[str] | None = None) -> str:
    """The onnxruntime provider to use for `MNEMO_PROVIDER=requested` (auto: CUDA if offered, else CPU)."""
    available = ort.get_available_providers() if available is None else available
    if "," in requested:  # one provider per instance (`cuda,cpu`): every entry is checked, the first returned
        resolved = [resolve_provider(entry, available) for entry in split_list(requested)]
        return resolved[0]
    if requested == "auto":
        chosen = PROVIDER_NAMES["cuda"] if PROVIDER_NAMES["cuda"] in available else PROVIDER_NAMES["cpu"]
        logger.info("MNEMO_PROVIDER=auto chose %s (available: %s)", chosen, ", ".join(available))
        return chosen
    if requested not in PROVIDER_NAMES:
        raise ProviderUnavailable(f"unknown provider {requested!r}; choose one of auto, {', '.join(PROVIDER_NAMES)}")
    chosen = PROVIDER_NAMES[requested]
    if chosen not in available:
        raise ProviderUnavailable(
            f"MNEMO_PROVIDER={requested} asks for {chosen}, but this onnxruntime offers only "
            f"{', '.join(available)}; install onnxruntime-gpu with the CUDA libraries, or set MNEMO_PROVIDER=cpu"
        )
    return chosen


def session_providers(chosen: str, settings: Settings) -> list[tuple[str, dict[str, str]]]:
    """The providers of a session, with their options: the chosen one, then CPU for the nodes a GPU cannot run
    (TensorRT: CUDA, then CPU)."""
    cpu = (PROVIDER_NAMES["cpu"], {})
    if chosen == cpu[0]:
        return [cpu]
    cuda = (PROVIDER_NAMES["cuda"], cuda_options(settings))
    tensorrt = [(chosen, {"device_id": cuda[1]["device_id"]})] if chosen == PROVIDER_NAMES["tensorrt"] else []
    return [*tensorrt, cuda, cpu]


def cuda_options(settings: Settings) -> dict[str, str]:
    """The CUDA provider's options from the MNEMO_CUDA_* settings (on this process's device: `for_worker`)."""
    options = {
        "device_id": split_list(settings.cuda_device_id)[0],
        "use_tf32": "1" if settings.cuda_tf32 else "0",
        "arena_extend_strategy": settings.cuda_arena_extend_strategy,
        "cudnn_conv_algo_search": settings.cuda_conv_algo_search,
        "do_copy_in_default_stream": "1",  # 0 can race (onnxruntime issue 4829)
    }
    if settings.cuda_mem_limit_mb is not None:
        options["gpu_mem_limit"] = str(settings.cuda_mem_limit_mb * 1024 * 1024)
    return options


def for_worker(settings: Settings, worker: int) -> Settings:
    """The settings of gunicorn's `worker`-th worker: on the device MNEMO_CUDA_DEVICE_ID gives it (round robin)."""
    ids = split_list(settings.cuda_device_id)
    return settings.model_copy(update={"cuda_device_id": ids[worker % len(ids)]})


def check_session_provider(session: ort.InferenceSession, chosen: str, model_name: str) -> str:
    """The provider the session really uses; a silent fallback is an error."""
    in_use = session.get_providers()[0]
    if in_use != chosen:
        raise ProviderUnavailable(
            f"model {model_name}: asked for {chosen} but onnxruntime created the session on {in_use}"
        )
    return in_use


def session_options(settings: Settings) -> ort.SessionOptions:
    """Threads from the budget, no spinning (the CPUs are shared with request handling), the CPU arena as
    MNEMO_CPU_ARENA says (it makes large runs faster, but keeps the memory of the largest run for good)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = settings.intra_op_threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.enable_cpu_mem_arena = settings.cpu_arena
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def open_session(path: Path, settings: Settings, provider: str) -> ort.InferenceSession:
    """The one place a session is created: the thread budget's options, the provider's options from settings."""
    return ort.InferenceSession(str(path), session_options(settings), providers=session_providers(provider, settings))


def _open_verified(path: Path, sha256: str, settings: Settings, provider: str) -> ort.InferenceSession:
    verify(path, path.name, sha256, "model file")
    return open_session(path, settings, provider)


class PreopenedSessions:
    """Sessions opened on background threads (ONNX Runtime builds one without the GIL), each taken at most once."""

    def __init__(self) -> None:
        self._settings: Settings | None = None
        self._sessions: dict[tuple[Path, str, str], Future[ort.InferenceSession]] = {}  # by file, sha256, provider

    def start(self, settings: Settings) -> None:
        """Start verifying and opening every ONNX file the manifest names; the registry reports any problem."""
        try:
            artifacts, provider = Path(settings.artifacts_dir), resolve_provider(settings.provider)
            parts = [part for entry in load_manifest(artifacts).models for part in (entry, *entry.graphs.values())]
            paths = [(confined(artifacts, part.file), part.sha256) for part in parts]
        except Exception:  # the registry reads the manifest again and reports what is wrong
            return
        self._settings = settings
        # One CPU is left to the imports that run meanwhile on the main thread.
        pool = ThreadPoolExecutor(max_workers=max(1, usable_cpus() - 1), thread_name_prefix="preopen")
        for path, sha256 in paths:
            self._sessions[(path, sha256, provider)] = pool.submit(_open_verified, path, sha256, settings, provider)
        pool.shutdown(wait=False)

    def take(self, path: Path, sha256: str, provider: str, settings: Settings) -> ort.InferenceSession | None:
        """The session opened early for exactly this file, checksum, provider and settings; None otherwise."""
        future = self._sessions.pop((path, sha256, provider), None)
        if future is not None and settings == self._settings:
            with contextlib.suppress(Exception):  # opened again by the registry, which reports the error
                return future.result()
        return None

    def clear(self) -> None:
        """Drop the sessions nobody took (models the registry did not load), so their memory is freed."""
        self._sessions.clear()


preopened = PreopenedSessions()
