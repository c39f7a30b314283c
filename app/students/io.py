"""`StoreCalls`: the store's blocking calls, off the event loop, on threads of their own.

A stalled database (SQLite waiting up to its busy timeout for another writer's lock, a Redis server that
stopped answering) blocks each call for seconds. On the worker threads that parse and render requests
(app/runtime/offload.py) it would take every endpoint down with it. Here the store has `STORE_THREADS`
threads of its own, and at most `MAX_WAITING` calls may wait for one: beyond that a call is refused at once
(`StoreBusy`: 429 with Retry-After, like the service's other full queues; the store is not down, and a 503
would tell a load balancer this replica is).

Two kinds of call:
- `read` (no side effect): a caller cancelled (deadline, client gone) stops waiting; a call that has not
  started never runs.
- `commit` (a write): cancelled before it starts, it never runs; cancelled once it runs, the caller waits
  for it and returns its result, so that what the client is told is what the store holds (a 504 never hides
  a write that happened). A store call is bounded in time by its store (SQLite's busy timeout, Redis's reply
  timeout), so such an answer comes at most that late.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import ParamSpec, TypeVar

from app.students.store import StoreError

STORE_THREADS = 4  # store calls wait on I/O, not on the GIL
MAX_WAITING = 64
P = ParamSpec("P")
T = TypeVar("T")


class StoreBusy(StoreError):
    """More than MAX_WAITING store calls wait for a thread: the store is slow or stalled (429, Retry-After)."""

    status_code = 429


class StoreCalls:
    """Runs store calls on `threads` threads, with at most `max_waiting` waiting for one."""

    def __init__(self, threads: int = STORE_THREADS, max_waiting: int = MAX_WAITING) -> None:
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="store-io")
        self._threads, self._max_waiting = threads, max_waiting
        self._limit = threads + max_waiting
        self._pending = 0
        self._lock = threading.Lock()

    async def read(self, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`function(*args, **kwargs)` on a store thread; a cancelled caller drops its result."""
        return await asyncio.wrap_future(self._submit(partial(function, *args, **kwargs)))

    async def commit(self, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`function(*args, **kwargs)` on a store thread; once it has started, its caller gets its result even
        when cancelled meanwhile (see the module docstring)."""
        job = self._submit(partial(function, *args, **kwargs))
        outcome = asyncio.wrap_future(job)
        try:
            return await asyncio.shield(outcome)
        except asyncio.CancelledError:
            if job.cancel():  # not started: nothing was written
                raise
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()  # this cancellation is answered with the write's own result
            return await outcome

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)

    def _submit(self, call: Callable[[], T]) -> Future[T]:
        with self._lock:
            if self._pending >= self._limit:
                raise StoreBusy(
                    f"The student state store is busy: {self._threads} calls running and {self._max_waiting} waiting, "
                    "the most it takes; only the /students endpoints are affected, retry after the Retry-After delay."
                )
            self._pending += 1
        job = self._executor.submit(call)
        job.add_done_callback(self._finished)
        return job

    def _finished(self, _: Future) -> None:
        with self._lock:
            self._pending -= 1
