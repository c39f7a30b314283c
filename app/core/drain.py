"""Graceful drain: readiness turns 503, connections opened after it get 503, the rest finishes.

Work still in flight when the drain's time is up is cancelled (`give_up`) and answers 503 in the service's shape
(`RequestEdge`), not the bare 500 of uvicorn's own cancellation at shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable


class Drain:
    """Shutdown state and the count of requests in flight (operations endpoints excluded)."""

    def __init__(self) -> None:
        self.draining = False
        self.gave_up = False
        self.open_before: set[object] = set()  # the clients (host, port) of the connections open when it began
        self._tasks: set[asyncio.Task] = set()  # the requests in flight (operations endpoints excluded)
        self.on_begin: list[Callable[[], None]] = []  # called when the drain begins (e.g. tell the probe process)
        self._changed: asyncio.Event | None = None

    def begin(self, open_connections: Iterable[object] = ()) -> None:
        if not self.draining:
            self.draining = True
            self.open_before = set(open_connections)
            self._notify()
            for listener in self.on_begin:
                listener()

    def refuses(self, client: object) -> bool:
        """Draining, and `client`'s connection was opened after the drain began."""
        return self.draining and client not in self.open_before

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def enter(self, task: asyncio.Task) -> None:
        self._tasks.add(task)

    def alone(self) -> bool:
        """At most one request in flight: called from inside a request, it is the only one."""
        return self.in_flight <= 1

    def leave(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        self._notify()

    def give_up(self) -> int:
        """Cancel the requests still in flight (the drain's time is up); returns how many."""
        self.gave_up = True
        for task in self._tasks:
            task.cancel("the drain's time is up")
        return len(self._tasks)

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no request is in flight, at most `timeout_s`; True when idle."""
        deadline = time.monotonic() + timeout_s
        while self.in_flight:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._changed = self._changed or asyncio.Event()
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)
        return True

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
