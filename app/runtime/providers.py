"""Execution-provider choice: explicit, logged, and never silently different from what was asked."""

from __future__ import annotations

import logging

import onnxruntime as ort

logger = logging.getLogger("mnemo.providers")

PROVIDER_NAMES = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
}


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


def session_providers(chosen: str) -> list[str]:
    """Providers to pass to a session: the chosen one first; CPU after it for the nodes a GPU cannot run."""
    if chosen == PROVIDER_NAMES["cpu"]:
        return [chosen]
    if chosen == PROVIDER_NAMES["tensorrt"]:
        return [chosen, PROVIDER_NAMES["cuda"], PROVIDER_NAMES["cpu"]]
    return [chosen, PROVIDER_NAMES["cpu"]]


def check_session_provider(session: ort.InferenceSession, chosen: str, model_name: str) -> str:
    """The provider the session really uses; a silent fallback is an error."""
    in_use = session.get_providers()[0]
    if in_use != chosen:
        raise ProviderUnavailable(
            f"model {model_name}: asked for {chosen} but onnxruntime created the session on {in_use}"
        )
    return in_use
