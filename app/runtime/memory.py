"""Giving memory back: glibc malloc settings and trimming, so RSS returns near idle after a burst.

The service frees large buffers (batch inputs, ONNX Runtime outputs, JSON answers) from several
threads. glibc then keeps one malloc arena per thread and holds freed pages inside them. The server
caps the arenas at startup (`limit_malloc_arenas`), and the engine asks glibc to return free pages
(`malloc_trim`) once the models have been idle for a moment. Elsewhere than glibc both do nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

logger = logging.getLogger("mnemo.memory")
M_ARENA_MAX = -8  # mallopt parameter (glibc malloc.h)
MALLOC_ARENAS = 2

_libc = None
_name = ctypes.util.find_library("c")
if _name:
    try:
        _libc = ctypes.CDLL(_name)
        _libc.malloc_trim  # noqa: B018 (glibc only: raises AttributeError elsewhere)
    except (OSError, AttributeError):
        _libc = None


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas (call before threads start); True when applied."""
    return bool(_libc is not None and _libc.mallopt(M_ARENA_MAX, arenas))


def release_free_memory() -> bool:
    """Return free heap pages to the operating system; True when glibc released some."""
    return bool(_libc is not None and _libc.malloc_trim(0))
