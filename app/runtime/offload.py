"""CPU work of requests (parsing, tokenizing, decoding, JSON) off the event loop, on `CPU_THREADS` threads (more
would only queue for the GIL); parsing comes before admission, so its queue is bounded too (429 past it)."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import ParamSpec, TypeVar

from app.core.errors import Overloaded

CPU_THREADS = 2
MAX_QUEUED_BYTES = 4 << 20  # a fraction of a second of parsing for the two threads: more would only wait
P = ParamSpec("P")
T = TypeVar("T")


class ParseQueueFull(Overloaded):
    """More than MAX_QUEUED_BYTES of bodies wait to be parsed (429)."""


_threads = ThreadPoolExecutor(max_workers=CPU_THREADS, thread_name_prefix="cpu-offload")
_queued_bytes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, int] = weakref.WeakKeyDictionary()


def saturated() -> bool:
    """True while more than MAX_QUEUED_BYTES of request bodies wait to be parsed."""
    return _queued_bytes.get(asyncio.get_running_loop(), 0) > MAX_QUEUED_BYTES


async def offload(function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run `function(*args, **kwargs)` on one of CPU_THREADS threads (FIFO); cancelled before it starts, never."""
    return await asyncio.get_running_loop().run_in_executor(_threads, partial(function, *args, **kwargs))


async def offload_or_shed(size: int, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`offload` for parsing `size` bytes, or Overloaded (429) at once while the parse queue is saturated."""
    loop = asyncio.get_running_loop()
    queued = _queued_bytes.get(loop, 0)
    if queued + size > MAX_QUEUED_BYTES and queued:
        raise ParseQueueFull("The server is busy reading other requests; retry after the Retry-After delay.")
    _queued_bytes[loop] = queued + size
    try:
        return await offload(function, *args, **kwargs)
    finally:
        _queued_bytes[loop] -= size


async def offload_if(heavy: bool, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`offload` a heavy job; a light one runs inline, which is cheaper than the thread hop."""
    return await offload(function, *args, **kwargs) if heavy else function(*args, **kwargs)
