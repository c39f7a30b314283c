"""CPU work of requests (tokenizing, encoding, decoding, JSON) off the event loop, on a few threads.

At most `CPU_THREADS` such jobs run at once: more threads than cores only fight over the GIL and
starve the event loop, which must keep answering /health and admitting or refusing requests.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from functools import partial
from typing import ParamSpec, TypeVar

import anyio.to_thread
from anyio import CapacityLimiter

CPU_THREADS = 4
P = ParamSpec("P")
T = TypeVar("T")
_limiters: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, CapacityLimiter] = weakref.WeakKeyDictionary()


async def offload(function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run `function(*args, **kwargs)` on a worker thread, at most CPU_THREADS at once per event loop."""
    loop = asyncio.get_running_loop()
    limiter = _limiters.get(loop)
    if limiter is None:
        limiter = _limiters[loop] = CapacityLimiter(CPU_THREADS)
    return await anyio.to_thread.run_sync(partial(function, *args, **kwargs), limiter=limiter)
