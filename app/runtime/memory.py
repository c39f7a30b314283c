"""Giving memory back after a burst on glibc (elsewhere a no-op): few malloc arenas, large freed buffers kept in the
heap for reuse (an unmapped one page-faults in again on every ONNX run), and `malloc_trim` once the models idle."""

from __future__ import annotations

import ctypes
import ctypes.util

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


def release_free_memory() -> bool:
    """Return free heap pages to the operating system; True when glibc released some."""
    return bool(_libc is not None and _libc.malloc_trim(0))
