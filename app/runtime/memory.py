"""Giving memory back after a burst on glibc (elsewhere a no-op): few malloc arenas, large freed buffers kept in the
heap for reuse (an unmapped one page-faults in again on every ONNX run), and `malloc_trim` once the models idle."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.runtime.batcher import ModelBatcher

TRIM_EVERY_S = 2.0  # how often idle models give freed memory back
MALLOPT = (  # (parameter of glibc's malloc.h, value) for mallopt
    (-8, 2),  # M_ARENA_MAX: malloc arenas
    (-3, 32 << 20),  # M_MMAP_THRESHOLD: glibc's largest; blocks above it are still mapped and unmapped
    (-1, 128 << 20),  # M_TRIM_THRESHOLD: free heap top kept on free(); the idle trim returns it
)

try:
    _libc: ctypes.CDLL | None = ctypes.CDLL(ctypes.util.find_library("c"))
    _libc.malloc_trim  # noqa: B018 (glibc only: raises AttributeError elsewhere)
except (OSError, AttributeError):
    _libc = None


def tune_malloc() -> bool:
    """Cap glibc's malloc arenas and keep freed large buffers (call before threads start); True when applied."""
    return _libc is not None and all([_libc.mallopt(key, value) for key, value in MALLOPT])  # all, even past a failure


async def trim_when_idle(batchers: Sequence[ModelBatcher]) -> None:
    """After runs (the statistics time the last), once no model has work admitted, hand free heap pages back."""
    trimmed_at = 0
    while _libc is not None:
        await asyncio.sleep(TRIM_EVERY_S)
        last_run = max((batcher.stats.last_inference_ms for batcher in batchers), default=0)
        if last_run != trimmed_at and not any(batcher.admitted_rows for batcher in batchers):
            await asyncio.to_thread(_libc.malloc_trim, 0)
            trimmed_at = last_run
