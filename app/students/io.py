"""The service's one store (`StoreHolder`), whose blocking calls run on threads of their own, so that a stalled
database holds up the /students endpoints only, never the threads that parse other requests."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar
from weakref import WeakValueDictionary

from app.students.factory import open_store
from app.students.store import StateStore, StoreError, StoreUnavailable

STORE_THREADS = 4  # store calls wait on I/O, not on the GIL
MAX_WAITING = 64
T = TypeVar("T")
logger = logging.getLogger("mnemo.students")


class StoreBusy(StoreError):
    """More than MAX_WAITING store calls wait for a thread: the store is slow, not down (429, Retry-After)."""

    status_code = 429


class StoreHolder:
    """The store of `url`, opened on first need (again after a failed open), its calls run on STORE_THREADS threads with
    at most MAX_WAITING waiting (then `StoreBusy`); a database unreachable at startup does not stop the service."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._store: StateStore | None = None
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=STORE_THREADS, thread_name_prefix="store-io")
        self._room = threading.Semaphore(STORE_THREADS + MAX_WAITING)  # calls running or waiting
        # One append at a time per (model, student) in this process: the others would only lose its race.
        self.writers: WeakValueDictionary[tuple[str, str], asyncio.Lock] = WeakValueDictionary()

    def open(self) -> None:
        """At startup: open and check the store; log (do not raise) if the database is unavailable."""
        try:
            self.get().check_health()
        except StoreUnavailable as error:
            logger.warning(
                "student state store unavailable at startup: %s; /students answers 503 until it is back", error.internal
            )

    def get(self) -> StateStore:
        """The open store (blocking: call it off the event loop); `StoreUnavailable` if it cannot be opened."""
        with self._lock:
            if self._store is None:
                self._store = open_store(self._url)
            return self._store

    async def read(self, call: Callable[[StateStore], T]) -> T:
        """`call(store)` on a store thread; a cancelled caller drops its result."""
        return await asyncio.wrap_future(self._submit(call))

    async def commit(self, call: Callable[[StateStore], T]) -> T:
        """A write: cancelled before it starts, it never runs; once started, its caller gets its result even when
        cancelled meanwhile, so a 504 never hides a write that happened."""
        job = self._submit(call)
        outcome = asyncio.wrap_future(job)
        try:
            return await asyncio.shield(outcome)
        except asyncio.CancelledError:
            if job.cancel():  # not started: nothing was written
                raise
            asyncio.current_task().uncancel()  # this cancellation is answered with the write's own result
            return await outcome

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None

    def _submit(self, call: Callable[[StateStore], T]) -> Future[T]:
        if not self._room.acquire(blocking=False):
            raise StoreBusy(
                f"The student state store is busy: {STORE_THREADS} calls running and {MAX_WAITING} waiting, "
                "the most it takes; only the /students endpoints are affected, retry after the Retry-After delay."
            )
        job = self._executor.submit(lambda: call(self.get()))
        job.add_done_callback(lambda _: self._room.release())
        return job
