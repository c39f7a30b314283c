"""uvicorn with a graceful drain: what `python -m app` runs.

On the first SIGTERM (or SIGINT, or SIGHUP: there is no reload) the app starts draining: `/ready`
answers 503 at once, new requests get a quick 503 (`Retry-After`, `Connection: close`) while the
listening socket stays open, so no connection waiting to be accepted is reset. Requests already admitted
finish; when none is left, or after MNEMO_DRAIN_S, uvicorn shuts down as usual (closes the listener and
idle connections, runs the lifespan shutdown) and the process exits with status 0. A second signal stops
waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from types import FrameType

import uvicorn
from fastapi import FastAPI

from app.core.logging import uvicorn_log_config, write_out_logs
from app.core.settings import Settings
from app.runtime.memory import tune_malloc
from app.transports.connection_guard import ConnectionLimits, guarded_protocol

logger = logging.getLogger("mnemo.server")
SHUTDOWN_GRACE_S = 5  # after the drain, how long uvicorn waits for stragglers before cancelling them
GIVE_UP_S = 1.0  # after the drain's time is up, how long its cancelled requests have to send their 503
GIL_SWITCH_INTERVAL_S = 0.001  # the event loop waits at most this long for the GIL held by a worker thread


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose first shutdown signal drains the app before the usual graceful shutdown."""

    def __init__(
        self,
        config: uvicorn.Config,
        app: FastAPI,
        drain_s: float,
        on_started: Callable[[], None] | None = None,
        parent_gone_signal: int | None = None,
    ) -> None:
        super().__init__(config)
        self.state = app.state
        self.drain = app.state.drain
        self.drain_s = drain_s
        self.on_started = on_started  # called once the app has started and the server accepts connections
        self.parent_gone_signal = parent_gone_signal  # a worker's word from Linux that its supervisor died
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self.lifespan.send = self._without_model_traceback(self.lifespan.send)
        await super().startup(sockets)
        if self.started and self.on_started is not None:
            self.on_started()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's handlers for SIGTERM and SIGINT, and SIGHUP handled like them: a drain, then exit 0 (by
        default it killed the process with its requests in flight)."""
        if threading.current_thread() is not threading.main_thread():  # signals are for the main thread
            with super().capture_signals():
                yield
            return
        previous = {signal.SIGHUP: signal.signal(signal.SIGHUP, self.handle_exit)}
        if self.parent_gone_signal is not None:
            previous[self.parent_gone_signal] = signal.signal(self.parent_gone_signal, self.handle_parent_gone)
        try:
            with super().capture_signals():
                yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _without_model_traceback(self, send: Callable[[dict], Awaitable[None]]) -> Callable[[dict], Awaitable[None]]:
        """uvicorn's lifespan `send`, minus the traceback of a model that cannot load: `serve` says it in one line."""

        async def brief_send(message: dict) -> None:
            if message["type"] == "lifespan.startup.failed" and self.state.startup_error:
                message = {**message, "message": ""}
            await send(message)

        return brief_send

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain.draining or self._loop is None:
            self.should_exit = True  # a second signal (or no loop yet): stop now
            self.force_exit = self.force_exit or (sig == signal.SIGINT and self.drain.draining)
            return
        self._begin_drain(signal.Signals(sig).name)

    def handle_parent_gone(self, sig: int, frame: FrameType | None) -> None:
        """The supervisor died (app/worker.py): drain as on a first SIGTERM. Linux sends the signal again each
        time the worker is handed to a new parent (another supervisor thread still exiting, a subreaper), so
        it is no "second signal": repeats are ignored."""
        if self.drain.draining:
            return
        if self._loop is None:  # still starting: stop now
            self.should_exit = True
            return
        self._begin_drain("supervisor gone")

    def _begin_drain(self, reason: str) -> None:
        self.drain.begin()
        self._loop.call_soon_threadsafe(self._start_drain, reason)

    def _start_drain(self, reason: str) -> None:
        if self._drain_task is not None:  # a signal that arrived inside the first one's handler
            return
        logger.info("%s: draining (%d request(s) in flight, up to %gs)", reason, self.drain.in_flight, self.drain_s)
        self._drain_task = asyncio.ensure_future(self._finish_drain())

    async def _finish_drain(self) -> None:
        idle = await self.drain.wait_idle(self.drain_s)
        if idle:
            logger.info("drained: no request in flight")
        else:
            given_up = self.drain.give_up()
            logger.warning("drain timeout: %d request(s) in flight after %gs, answered 503", given_up, self.drain_s)
            await self.drain.wait_idle(GIVE_UP_S)  # their 503s (a store write that has started finishes first)
        self.should_exit = True


def serve(
    settings: Settings,
    app: FastAPI | None = None,
    sockets: list[socket.socket] | None = None,
    on_started: Callable[[], None] | None = None,
    parent_gone_signal: int | None = None,
) -> None:
    """Serve the app (default: `create_app(settings)`) until a signal, draining first.

    It listens on MNEMO_HOST:MNEMO_PORT, or on `sockets` already bound (a worker of app/supervisor.py): uvicorn
    calls listen() on them once the app has started. `parent_gone_signal` (a worker's) drains once, however
    often it comes.
    """
    from app.main import create_app

    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    tune_malloc()
    app = app or create_app(settings)
    limits = ConnectionLimits(
        max_connections=settings.max_connections,
        header_timeout_s=settings.header_timeout_s,
        max_header_bytes=settings.max_header_bytes,
        write_timeout_s=settings.write_timeout_s,
        on_refused=partial(app.state.metrics.refused, "connections"),
        on_bad_request=app.state.metrics.bad_request,
    )
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        http=guarded_protocol(limits),
        timeout_keep_alive=settings.keep_alive_s,
        log_level=settings.log_level,
        log_config=uvicorn_log_config(settings.log_level),
        access_log=False,  # the app writes one access line per request itself (app/transports/middleware.py)
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        loop="asyncio",
        ws="none",  # no WebSocket routes: uvicorn then imports no websocket library (a faster start)
    )
    try:
        DrainingServer(config, app, settings.drain_s, on_started, parent_gone_signal).run(sockets)
    except SystemExit:  # uvicorn's status 3 when the lifespan's startup failed
        if app.state.startup_error:
            write_out_logs()  # uvicorn's own lines first: this one is the last
            sys.exit(f"mnemo: cannot start: {app.state.startup_error}")
        raise
