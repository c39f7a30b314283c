"""A batch the device cannot hold: split in halves along the batch axis and run again, down to one row (else 503).

ONNX Runtime's arena fails a run past its bound (`MNEMO_CUDA_MEM_LIMIT_MB`) or the device's memory, and the session
stays usable. After a split, `max_rows` is the most rows known to fit, so the batcher stops forming such batches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType

from app.core.errors import ServiceError
from app.runtime.collate import Feeds, concatenate

# What onnxruntime says when an allocation fails: its arena past its bound, or CUDA, cuBLAS or cuDNN out of memory
OUT_OF_MEMORY_MESSAGES = (
    "Failed to allocate memory",
    "is smaller than requested bytes",
    "out of memory",
    "STATUS_ALLOC_FAILED",
)


class DeviceOutOfMemory(ServiceError):
    """One row of the batch does not fit in the device's memory (or the arena's bound)."""

    status_code = 503
    headers = MappingProxyType({"Retry-After": "1"})


def is_out_of_memory(error: Exception) -> bool:
    """True for onnxruntime's allocation failures (its Python exceptions differ by build: the message is the same)."""
    message = str(error)
    return any(part in message for part in OUT_OF_MEMORY_MESSAGES)


@dataclass
class BatchSplitter:
    """Runs batches through `run`, splitting those the device cannot hold; `on_split` counts each split."""

    on_split: Callable[[], None] = lambda: None
    max_rows: int | None = None  # None until a run failed for memory

    def run(self, run: Callable[[Feeds], Feeds], feeds: Feeds, model: str) -> Feeds:
        rows = len(next(iter(feeds.values())))
        try:
            return run(feeds)
        except Exception as error:
            if not is_out_of_memory(error):
                raise
            if rows <= 1:
                raise DeviceOutOfMemory(
                    f"Model {model}: one row of this request does not fit in the device's memory; retry later "
                    "or send a shorter input."
                ) from error
        half = (rows + 1) // 2
        self.max_rows = half if self.max_rows is None else min(self.max_rows, half)
        self.on_split()
        first = {name: value[:half] for name, value in feeds.items()}
        second = {name: value[half:] for name, value in feeds.items()}
        return concatenate([self.run(run, first, model), self.run(run, second, model)])
