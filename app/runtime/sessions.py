"""ONNX Runtime sessions: their options (from the thread budget), and opening them early for a faster start.

`preopened.start(settings)` verifies and opens every ONNX file of the manifest on background threads while the
web stack is imported (ONNX Runtime builds a session without holding the GIL). The registry takes each session
from `preopened`, or verifies and opens the file itself, so every error is still reported by the registry.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import onnxruntime as ort

from app.core.integrity import verify
from app.core.manifest import confined, load_manifest
from app.core.settings import Settings, usable_cpus
from app.runtime.providers import resolve_provider, session_providers

SessionKey = tuple[Path, str, str]  # file, sha256, provider


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


class PreopenedSessions:
    """Sessions being opened in the background, each taken at most once."""

    def __init__(self) -> None:
        self._settings: Settings | None = None
        self._sessions: dict[SessionKey, Future[ort.InferenceSession]] = {}

    def start(self, settings: Settings) -> None:
        """Start verifying and opening every ONNX file the manifest names; any problem is left to the registry."""
        try:
            artifacts = Path(settings.artifacts_dir)
            manifest = load_manifest(artifacts)
            provider = resolve_provider(settings.provider)
            files = [(entry.file, entry.sha256) for entry in manifest.models]
            files += [(graph.file, graph.sha256) for entry in manifest.models for graph in entry.graphs.values()]
            paths = [(confined(artifacts, name), sha256) for name, sha256 in files]
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
        if future is None or settings != self._settings:
            return None
        try:
            return future.result()
        except Exception:  # opened again by the registry, which reports the error
            return None

    def clear(self) -> None:
        """Drop the sessions nobody took (models the registry did not load), so their memory is freed."""
        self._sessions.clear()


def _open_verified(path: Path, sha256: str, settings: Settings, provider: str) -> ort.InferenceSession:
    verify(path, path.name, sha256, "model file")
    return open_session(path, settings, provider)


preopened = PreopenedSessions()
