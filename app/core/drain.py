"""Graceful drain: new connections and readiness get 503; requests in flight finish, or are cancelled at its end."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable


class Drain:
    """Shutdown state and the requests in flight (operations endpoints excluded)."""

    def __init__(self) -> None:
        self.draining = self.gave_up = False
        self.open_before: set[object] = set()  # the clients (host, port) of the connections open when it began
        self.on_begin: list[Callable[[], None]] = []  # called when the drain begins (e.g. tell the probe process)
        self.tasks: set[asyncio.Task] = set()  # the requests in flight

    def begin(self, open_connections: Iterable[object] = ()) -> None:
        if not self.draining:
            self.draining, self.open_before = True, set(open_connections)
            for listener in self.on_begin:
                listener()

    def alone(self) -> bool:
        """At most one request in flight: called from inside a request, it is the only one."""
        return len(self.tasks) <= 1

    def enter(self, task: asyncio.Task) -> None:
        self.tasks.add(task)

    def leave(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)

    async def wait_idle(self) -> None:
        """Wait until no request is in flight (each task that was has ended)."""
        while self.tasks:
            await asyncio.wait(set(self.tasks))
