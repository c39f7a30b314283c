"""`StoreHolder`: the service's one student-state store, opened in the app lifespan and closed on shutdown.

A database that cannot be reached at startup does not stop the service: the stateless endpoints never
touch the store, and the /students endpoints answer 503 (`StoreUnavailable`) until it is back. A store
that could not even be opened (e.g. an SQLite directory that cannot be created) is opened again on the
next request that needs it. A malformed MNEMO_STATE_URL is a configuration error and stops startup.
"""

from __future__ import annotations

import logging
import threading

from app.students.factory import open_store
from app.students.io import StoreCalls
from app.students.store import StateStore, StoreUnavailable

logger = logging.getLogger("mnemo.students")


class StoreHolder:
    """Opens the store of `url` once, on first need, and hands it out; thread-safe."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._store: StateStore | None = None
        self._lock = threading.Lock()
        self.calls = StoreCalls()  # every store call of a request runs here, never on the parsing threads

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

    def close(self) -> None:
        self.calls.close()
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None
