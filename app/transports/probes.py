"""/health and /ready on MNEMO_PROBE_PORT from a child process (probe_server.py), fed the readiness every
FEED_INTERVAL_S: a thread of this process would wait for the GIL behind a saturated event loop."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable

logger = logging.getLogger("mnemo.probes")
FEED_INTERVAL_S = 0.1
START_TIMEOUT_S = 10.0
Readiness = Callable[[], tuple[int, dict]]


class ProbeStartError(RuntimeError):
    """The probe process could not listen (the port is taken, or it did not start)."""


class ProbeProcess:
    """Starts the probe server on `host:port`, keeps it fed with `readiness()`, stops it."""

    def __init__(self, host: str, port: int, readiness: Readiness) -> None:
        self.host, self.port, self.readiness = host, port, readiness
        self._process: subprocess.Popen | None = None
        self._feeder: asyncio.Task | None = None

    def spawn(self) -> None:
        """Start the child and feed it from now on: it says "loading" while the service loads its models."""
        self._process = subprocess.Popen(
            [sys.executable, "-m", "app.transports.probe_server", self.host, str(self.port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        os.set_blocking(self._process.stdin.fileno(), False)
        self._feeder = asyncio.create_task(self._feed(), name="probe-feed")

    async def start(self) -> None:
        """Wait until the child listens; ProbeStartError if it cannot (the port is taken)."""
        try:
            first = await asyncio.wait_for(asyncio.to_thread(self._process.stdout.readline), START_TIMEOUT_S)
        except TimeoutError:
            first = "no answer"
        if first.strip() != "listening":
            self._process.kill()
            raise ProbeStartError(f"MNEMO_PROBE_PORT: the probe server did not start: {first.strip() or 'exited'}")
        self.push()  # the readiness of now, before the main port opens (the feeder's first turn comes later)
        logger.info("probes: /health and /ready also on http://%s:%d (own process)", self.host, self.port)

    def push(self) -> None:
        """Send the current readiness now (also from a signal handler: one small non-blocking write)."""
        if self._process is None or self._process.stdin.closed:
            return
        line = json.dumps(self.readiness()) + "\n"
        with contextlib.suppress(BlockingIOError, BrokenPipeError, ValueError):
            self._process.stdin.write(line)
            self._process.stdin.flush()

    async def _feed(self) -> None:
        while True:
            self.push()
            await asyncio.sleep(FEED_INTERVAL_S)

    async def stop(self) -> None:
        if self._feeder is not None:
            self._feeder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._feeder
        if self._process is not None:
            with contextlib.suppress(BrokenPipeError, BlockingIOError):
                self._process.stdin.close()  # EOF: the probe server exits
            try:
                await asyncio.to_thread(self._process.wait, 5)
            except subprocess.TimeoutExpired:
                self._process.kill()
