"""Giving memory back after a burst on glibc (elsewhere a no-op): few malloc arenas, large freed buffers kept in the
heap for reuse (an unmapped one page-faults in again on every ONNX run), and `malloc_trim` once the models idle.
"""

from __future__ import annotations

import ctypes
import ctypes.util

# mallopt parameters (glibc malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MALLOC_ARENAS = 2
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc's largest: blocks above it are still mapped and unmapped
TRIM_THRESHOLD_BYTES = 128 * 1024 * 1024  # free heap top kept on free(); the idle trim returns it

try:
    _libc: ctypes.CDLL | None = ctypes.CDLL(ctypes.util.find_library("c"))
    _libc.malloc_trim  # noqa: B018 (glibc only: raises AttributeError elsewhere)
except (OSError, AttributeError):
    _libc = None


def tune_malloc() -> bool:
    """Cap glibc's malloc arenas and keep freed large buffers (call before threads start); True when applied."""
    if _libc is None:
        return False
    settings = (
        (M_ARENA_MAX, MALLOC_ARENAS),
        (M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
        (M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
    )
    return all([_libc.mallopt(parameter, value) for parameter, value in settings])  # each one, even after a failure


def release_free_memory() -> bool:
    """Return free heap pages to the operating system; True when glibc released some."""
    return bool(_libc is not None and _libc.malloc_trim(0))
