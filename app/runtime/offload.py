"""CPU work of requests (parsing, tokenizing, decoding, JSON) off the event loop, on a few threads.

At most `CPU_THREADS` such jobs run at once: Python work holds the GIL, so more threads would only
queue for it and starve the event loop, which must keep answering /health and refusing requests.
Parsing happens before a request is admitted to a model, so its queue is bounded too: while more than
`MAX_QUEUED_BYTES` of bodies wait for a thread, `saturated()` is true and new request bodies are
refused with 429 before they are read (app/frame/middleware.py) or parsed (`offload_or_shed`).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import ParamSpec, TypeVar

import anyio.to_thread
from anyio import CapacityLimiter

from app.frame.errors import Overloaded

CPU_THREADS = 2
MAX_QUEUED_BYTES = 16 << 20  # about half a second of JSON parsing
P = ParamSpec("P")
T = TypeVar("T")


@dataclass
class _Pool:
    limiter: CapacityLimiter
    queued_bytes: int = 0


_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pool] = weakref.WeakKeyDictionary()


def _pool() -> _Pool:
    loop = asyncio.get_running_loop()
    pool = _pools.get(loop)
    if pool is None:
        pool = _pools[loop] = _Pool(CapacityLimiter(CPU_THREADS))
    return pool


def saturated() -> bool:
    """True while more than MAX_QUEUED_BYTES of request bodies wait to be parsed."""
    return _pool().queued_bytes > MAX_QUEUED_BYTES


async def offload(function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run `function(*args, **kwargs)` on a worker thread, at most CPU_THREADS at once per event loop."""
    return await anyio.to_thread.run_sync(partial(function, *args, **kwargs), limiter=_pool().limiter)


async def offload_or_shed(size: int, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`offload` for parsing `size` bytes, or Overloaded (429) at once while the parse queue is saturated."""
    pool = _pool()
    if pool.queued_bytes + size > MAX_QUEUED_BYTES and pool.queued_bytes:
        raise Overloaded("The server is busy reading other requests; retry after the Retry-After delay.")
    pool.queued_bytes += size
    try:
        return await anyio.to_thread.run_sync(partial(function, *args, **kwargs), limiter=pool.limiter)
    finally:
        pool.queued_bytes -= size
