"""Execution-provider choice: explicit, logged, and never silently different from what was asked."""

from __future__ import annotations

import logging

import onnxruntime as ort

from app.core.settings import Settings, split_list

logger = logging.getLogger("mnemo.providers")

PROVIDER_NAMES = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
}


ProviderChoice = tuple[str, dict[str, str]]  # a provider and its options, as InferenceSession takes them


class ProviderUnavailable(RuntimeError):
    """The requested execution provider cannot be used by this onnxruntime."""


def resolve_provider(requested: str, available: list[str] | None = None) -> str:
    """The onnxruntime provider name to use for `MNEMO_PROVIDER=requested` (auto: CUDA if offered, else CPU)."""
    available = ort.get_available_providers() if available is None else available
    if "," in requested:  # one provider per instance (`cuda,cpu`): every entry is checked, the first returned
        resolved = [resolve_provider(entry.strip(), available) for entry in requested.split(",") if entry.strip()]
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


def session_providers(chosen: str, settings: Settings) -> list[ProviderChoice]:
    """Providers to pass to a session: the chosen one first, with its options; CPU after it for the nodes a GPU
    cannot run (TensorRT: CUDA, then CPU)."""
    cpu = (PROVIDER_NAMES["cpu"], {})
    if chosen == PROVIDER_NAMES["cpu"]:
        return [cpu]
    cuda = (PROVIDER_NAMES["cuda"], cuda_options(settings))
    if chosen == PROVIDER_NAMES["tensorrt"]:
        return [(chosen, {"device_id": cuda[1]["device_id"]}), cuda, cpu]
    return [cuda, cpu]


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
