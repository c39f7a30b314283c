"""Giving memory back: glibc malloc settings and trimming, so RSS returns near idle after a burst.

The service frees large buffers (batch inputs, ONNX Runtime outputs, JSON answers) from several
threads. glibc then keeps one malloc arena per thread and holds freed pages inside them. The server
caps the arenas at startup (`tune_malloc`), and the engine asks glibc to return free pages
(`malloc_trim`) once the models have been idle for a moment. Elsewhere than glibc both do nothing.

`tune_malloc` also keeps freed buffers of up to 32 MB in the heap instead of unmapping them. By default
glibc serves large blocks with a fresh mmap and unmaps them on free, so every ONNX run (its arena is off)
would page-fault its buffers in again, which costs as much as the run itself. The idle trim gives the
memory back instead.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

logger = logging.getLogger("mnemo.memory")
# mallopt parameters (glibc malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MALLOC_ARENAS = 2
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc's largest: blocks above it are still mapped and unmapped
TRIM_THRESHOLD_BYTES = 128 * 1024 * 1024  # free heap top kept on free(); the idle trim returns it

_libc = None
_name = ctypes.util.find_library("c")
if _name:
    try:
        _libc = ctypes.CDLL(_name)
        _libc.malloc_trim  # noqa: B018 (glibc only: raises AttributeError elsewhere)
    except (OSError, AttributeError):
        _libc = None


def tune_malloc() -> bool:
    """Cap glibc's malloc arenas and keep freed large buffers for reuse (call before threads start); True when
    applied."""
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
