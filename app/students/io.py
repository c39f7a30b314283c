"""MNEMO_STATE_URL's store, checked and opened (messages never echo the URL: it may hold a password), its blocking calls
on threads of their own: a stalled database holds up the /students endpoints only, never the parsing of others."""

from __future__ import annotations

import asyncio
import logging
import stat
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path
from typing import TypeVar
from urllib.parse import parse_qs, urlsplit
from weakref import WeakValueDictionary

from app.students.sqlite_store import SqliteStateStore
from app.students.store import StateStore, StoreError, StoreUnavailable

STORE_THREADS = 4  # store calls wait on I/O, not on the GIL
MAX_WAITING = 64
T = TypeVar("T")
logger = logging.getLogger("mnemo.students")
SQLITE_PREFIX = "sqlite://"
SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file
SYNCHRONOUS_MODES = ("full", "normal")
REDIS_SCHEMES = ("redis", "rediss", "unix")
# A password holding one of these cuts the URL early: its rest reads as the port or the database.
ENCODE_HINT = "(a password holding / ? # or @ must be percent-encoded)"


def open_store(url: str) -> StateStore:
    """`sqlite://PATH[?synchronous=full|normal]` (a relative PATH is taken from the working directory) or
    `redis://host:port/db` (also `rediss://`, `unix://`, and redis-py's query options such as `socket_timeout`)."""
    if url.startswith(SQLITE_PREFIX):
        return SqliteStateStore(*_sqlite_options(url.removeprefix(SQLITE_PREFIX)))
    check_url(url)  # here too: started as `uvicorn app.main:app`, nothing checks it at startup
    from app.students.redis_store import RedisStateStore  # redis-py, the optional extra mnemo[redis]: checked above

    return RedisStateStore(url)


def check_url(url: str) -> None:
    """ValueError naming MNEMO_STATE_URL when the URL is malformed (checked at startup, without connecting)."""
    if url.startswith(SQLITE_PREFIX):  # a directory or a file that is no SQLite database: no restart would mend it
        path = _sqlite_options(url.removeprefix(SQLITE_PREFIX))[0]
        try:
            mode = path.stat().st_mode
        except FileNotFoundError:  # created on opening
            mode = stat.S_IFREG
        except OSError as error:  # a parent this user may not search, a name past the file system's limit
            raise ValueError(f"MNEMO_STATE_URL names {path}, which cannot be reached: {error.strerror}") from None
        if stat.S_ISDIR(mode):
            raise ValueError(
                f"MNEMO_STATE_URL names {path}, a directory: name a database file, e.g. {path / 'students.db'}"
            )
        if not stat.S_ISREG(mode):  # a FIFO or a device: opening it below would block or read junk
            raise ValueError(f"MNEMO_STATE_URL names {path}, which is not a regular file: name a database file")
        with suppress(OSError), path.open("rb") as file:  # absent (created on opening) or unreadable (opening says why)
            if (header := file.read(len(SQLITE_HEADER))) and header != SQLITE_HEADER:
                raise ValueError(f"MNEMO_STATE_URL names {path}, a file that is not an SQLite database")
        return
    try:
        parts = urlsplit(url)
    except ValueError as error:  # e.g. "Invalid IPv6 URL": the message names no part of the URL
        raise ValueError(f"MNEMO_STATE_URL is not a valid URL: {error}") from None
    if parts.scheme not in REDIS_SCHEMES:
        schemes = "sqlite:// or redis:// (also rediss://, unix://)"
        raise ValueError(f"MNEMO_STATE_URL must start with {schemes}; got scheme {parts.scheme!r}")
    try:
        from redis.connection import parse_url
    except ModuleNotFoundError:
        raise ValueError(
            "MNEMO_STATE_URL is a Redis URL but redis-py is not installed: pip install 'mnemo[redis]'"
        ) from None
    try:
        _ = parts.port  # parsed on access
    except ValueError:  # urllib's message quotes the port, which may be a piece of the password
        raise ValueError(f"MNEMO_STATE_URL is not a valid Redis URL: its port is not a number {ENCODE_HINT}") from None
    try:
        parse_url(url)
    except ValueError as error:  # redis-py's own messages name the part (or query option), not its value
        raise ValueError(f"MNEMO_STATE_URL is not a valid Redis URL: {error}") from None
    database = parts.path.removeprefix("/")
    if parts.scheme != "unix" and database and not (database.isascii() and database.isdigit()):
        # redis-py reads a path such as /abc or /3/x as database 0 without a word: another database than meant
        raise ValueError(f"MNEMO_STATE_URL's database must be a number (redis://host:port/0) {ENCODE_HINT}")


def _sqlite_options(path_and_query: str) -> tuple[Path, str]:
    """The database file and the synchronous mode of `sqlite://PATH[?synchronous=full|normal]`."""
    path, _, query = path_and_query.partition("?")
    if not path:
        raise ValueError("MNEMO_STATE_URL sqlite:// needs a file path, e.g. sqlite:///var/lib/mnemo/students.db")
    options = parse_qs(query, keep_blank_values=True)
    if unknown := sorted(set(options) - {"synchronous"}):
        raise ValueError(f"MNEMO_STATE_URL sqlite:// takes only the option synchronous=full|normal, not {unknown}")
    synchronous = options.get("synchronous", ["full"])[-1].lower()
    if synchronous not in SYNCHRONOUS_MODES:
        raise ValueError(f"MNEMO_STATE_URL sqlite:// option synchronous must be one of {', '.join(SYNCHRONOUS_MODES)}")
    return Path(path).resolve(), synchronous.upper()


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
