"""ONNX Runtime sessions: the execution providers (never silently another) and the options from the settings."""

from __future__ import annotations

import logging
from pathlib import Path

import onnxruntime as ort

from app.core.settings import Settings, split_list

logger = logging.getLogger("mnemo.providers")
PROVIDER_NAMES = {name.lower(): f"{name}ExecutionProvider" for name in ("CPU", "CUDA", "Tensorrt")}  # MNEMO_PROVIDER


class ProviderUnavailable(RuntimeError):
    """The requested execution provider cannot be used by this onnxruntime."""


def resolve_providers(requested: str, available: list[str] | None = None) -> list[str]:
    """The onnxruntime provider of each instance MNEMO_PROVIDER lists (`cuda,cpu`; auto: CUDA if offered, else CPU)."""
    available = ort.get_available_providers() if available is None else available
    providers = []
    for entry in split_list(requested):  # each one of auto, cpu, cuda, tensorrt (Settings checks it)
        if entry == "auto":
            entry = "cuda" if PROVIDER_NAMES["cuda"] in available else "cpu"
            logger.info("MNEMO_PROVIDER=auto chose %s (available: %s)", PROVIDER_NAMES[entry], ", ".join(available))
        elif PROVIDER_NAMES[entry] not in available:
            raise ProviderUnavailable(
                f"MNEMO_PROVIDER={entry} asks for {PROVIDER_NAMES[entry]}, but this onnxruntime offers only "
                f"{', '.join(available)}; install onnxruntime-gpu with the CUDA libraries, or set MNEMO_PROVIDER=cpu"
            )
        providers.append(PROVIDER_NAMES[entry])
    return providers


def session_providers(chosen: str, settings: Settings) -> list[tuple[str, dict[str, str]]]:
    """A session's providers and their options: the chosen one, then those for the nodes it cannot run (CPU last)."""
    cpu, cuda = (PROVIDER_NAMES["cpu"], {}), (PROVIDER_NAMES["cuda"], cuda_options(settings))
    tensorrt = (PROVIDER_NAMES["tensorrt"], {"device_id": cuda[1]["device_id"]})
    return {cpu[0]: [cpu], cuda[0]: [cuda, cpu], tensorrt[0]: [tensorrt, cuda, cpu]}[chosen]


def cuda_options(settings: Settings) -> dict[str, str]:
    """The CUDA provider's options from the MNEMO_CUDA_* settings (on this process's device: `for_worker`)."""
    limit = {} if settings.cuda_mem_limit_mb is None else {"gpu_mem_limit": str(settings.cuda_mem_limit_mb << 20)}
    return {
        "device_id": split_list(settings.cuda_device_id)[0],
        "use_tf32": "1" if settings.cuda_tf32 else "0",
        "arena_extend_strategy": settings.cuda_arena_extend_strategy,
        "cudnn_conv_algo_search": settings.cuda_conv_algo_search,
        "do_copy_in_default_stream": "1",  # 0 can race (onnxruntime issue 4829)
        **limit,
    }


def for_worker(settings: Settings, worker: int) -> Settings:
    """The settings of gunicorn's `worker`-th worker: on the device MNEMO_CUDA_DEVICE_ID gives it (round robin)."""
    ids = split_list(settings.cuda_device_id)
    return settings.model_copy(update={"cuda_device_id": ids[worker % len(ids)]})


def open_session(path: Path, settings: Settings, provider: str) -> ort.InferenceSession:
    """The one place a session is created: threads from the budget (nodes in sequence: no inter-op pool), no spinning
    (request handling shares the CPUs), the arena per MNEMO_CPU_ARENA; on `provider` only (a fallback is an error)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = settings.intra_op_threads
    options.enable_cpu_mem_arena = settings.cpu_arena
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(path), options, providers=session_providers(provider, settings))
    if (in_use := session.get_providers()[0]) != provider:
        raise ProviderUnavailable(
            f"model file {path.name}: asked for {provider} but onnxruntime created the session on {in_use}"
        )
    return session
