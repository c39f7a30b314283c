"""What `python -m app` runs: gunicorn with uvicorn (h11) workers, configured from Settings. gunicorn replaces a
worker that dies or stalls; a worker's first SIGTERM (or SIGHUP) drains it (docs/ARCHITECTURE.md), a second stops it."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import uvicorn
from gunicorn.app.base import BaseApplication
from gunicorn.arbiter import Arbiter
from gunicorn.errors import HaltServer
from uvicorn_worker import UvicornWorker

from app.core.settings import Settings
from app.runtime.memory import tune_malloc
from app.transports.header_deadline import HeaderDeadline

if TYPE_CHECKING:
    from fastapi import FastAPI

logger = logging.getLogger("mnemo.server")
SHUTDOWN_GRACE_S = 5  # after the drain, how long uvicorn waits for stragglers before cancelling them
GIVE_UP_S = 1.0  # how long the requests given up on (drain timeout, second signal) have to send their 503
SETTLE_S = 1.0  # once idle, the drain still serves this long: requests sent but not yet read get their answer
HEARTBEAT_S = 1.0  # how often a worker's event loop tells gunicorn's master it is alive
ECHO_S = 0.5  # a signal this soon after the one that began the drain is its echo (process group, gunicorn's master)
GIL_SWITCH_INTERVAL_S = 0.001  # the event loop waits at most this long for the GIL held by a worker thread
METRICS_DIR = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's multiprocess mode: the workers' metrics files


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose first shutdown signal drains the app before uvicorn's own graceful shutdown."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.settings, self.drain = config.app.state.settings, config.app.state.drain
        config.app.state.connections = self.server_state.connections  # the edge's 503 past MNEMO_MAX_CONNECTIONS
        self.loop = asyncio.get_running_loop()  # a signal's handler starts the drain on it
        self.drained: Future | None = None
        self.drain_began = -math.inf

    async def startup(self, sockets: list | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            runs, threads = self.settings.concurrent_runs, self.settings.intra_op_threads
            logger.info("worker %d serving: %d concurrent run(s) x %d intra-op thread(s)", os.getpid(), runs, threads)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain.draining:  # a second signal: stop now, unless it is the first one's echo
            if time.monotonic() - self.drain_began < ECHO_S:
                return
            self.should_exit, self.force_exit = True, self.force_exit or sig in (signal.SIGINT, signal.SIGQUIT)
        else:
            self.drain_began = time.monotonic()
            self.drain.begin(connection.client for connection in self.server_state.connections)
            # once, also when a second signal came inside the first one's handler
            self.drained = self.drained or asyncio.run_coroutine_threadsafe(self.finish_drain(sig), self.loop)

    async def finish_drain(self, sig: int) -> None:
        """Requests in flight finish, then SETTLE_S more for those sent but not yet read; past drain_s, a 503."""
        drain_s, reason = self.settings.drain_s, signal.Signals(sig).name
        logger.info("%s: draining (%d request(s) in flight, up to %gs)", reason, len(self.drain.tasks), drain_s)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(drain_s):
                await self.drain.wait_idle()
                await asyncio.sleep(SETTLE_S)
                await self.drain.wait_idle()
        if left := self.drain.tasks:  # the drain's time is up
            logger.warning("drain timeout: %d request(s) in flight after %gs, answered 503", len(left), drain_s)
            await self.give_up()
        else:
            logger.info("drained: no request in flight")
        self.should_exit = True

    async def give_up(self) -> None:
        """Cancel the requests in flight: each answers 503 unless its answer began (a started store write finishes)."""
        self.drain.gave_up = True
        for task in self.drain.tasks:
            task.cancel("the server gave up on it")
        await asyncio.wait(self.drain.tasks, timeout=GIVE_UP_S)

    async def shutdown(self, sockets: list | None = None) -> None:
        """After a second signal, the requests in flight are answered 503, not with uvicorn's 500 as it cancels them."""
        if self.drain.tasks and not self.drain.gave_up:
            await self.give_up()
        await super().shutdown(sockets)


class Worker(UvicornWorker):
    """One gunicorn worker: the app on uvicorn (h11) with the limits of Settings, draining on its first signal."""

    def __init__(self, age: int, ppid: int, sockets: list, app: Gunicorn, *args: Any) -> None:
        """Made by gunicorn's master before it forks: numbered with the lowest number (0 up) no live worker has."""
        taken = {other.number for other in app.arbiter.WORKERS.values()}
        self.number = min(set(range(len(taken) + 1)) - taken)
        settings = app.settings  # the flags' and the environment's, as the master read them
        self.CONFIG_KWARGS = {**http_options(settings), "lifespan": "on", "timeout_keep_alive": settings.keep_alive_s}
        self.CONFIG_KWARGS |= {"timeout_graceful_shutdown": SHUTDOWN_GRACE_S, "timeout_notify": HEARTBEAT_S}
        super().__init__(age, ppid, sockets, app, *args)

    def init_process(self) -> None:
        """In the forked worker: its socket not listening until uvicorn serves, its CUDA device; then gunicorn's."""
        from app.runtime.sessions import for_worker

        self.sockets = [unlistened(listener) for listener in self.sockets]
        listed, self.app.settings = self.app.settings.cuda_device_id, for_worker(self.app.settings, self.number)
        if (device := self.app.settings.cuda_device_id) != listed:  # several ids: say which one this worker got
            self.log.info("worker %d is number %d: CUDA device %s", os.getpid(), self.number, device)
        super().init_process()

    def run(self) -> None:
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
        asyncio.run(self.serve())

    async def callback_notify(self) -> None:
        """The heartbeat to gunicorn's master; a worker whose master is gone (killed) drains and exits, once."""
        await super().callback_notify()
        if (parent := os.getppid()) != self.ppid:
            logger.warning("worker %d: gunicorn's master %d is gone", os.getpid(), self.ppid)
            self.ppid = parent  # its new parent: said and drained once
            os.kill(os.getpid(), signal.SIGTERM)

    async def serve(self) -> None:
        self.config.app = app = self.wsgi  # gunicorn's name for the loaded app, here the ASGI app
        hidden = ("Traceback", "startup failed", "Application startup failed")  # of a failure said in one line below
        for name in ("uvicorn.error", "mnemo"):
            logging.getLogger(name).addFilter(
                lambda record: not (app.state.startup_error and record.getMessage().startswith(hidden))
            )
        server = DrainingServer(self.config)
        signal.signal(signal.SIGHUP, server.handle_exit)  # like SIGTERM (uvicorn's): a worker is never reloaded
        signal.signal(signal.SIGQUIT, server.handle_exit)  # gunicorn's on SIGINT: like SIGINT (by default: a core dump)
        with contextlib.suppress(SystemExit):  # uvicorn's own exit when the app's startup failed
            await server.serve(sockets=self.sockets)
        if not server.started:  # one line saying why, and the status that makes gunicorn stop (not retry)
            reason = app.state.startup_error or "the app's startup failed (see above)"
            print(f"mnemo: cannot start: {reason}", file=sys.stderr, flush=True)
            sys.exit(Arbiter.WORKER_BOOT_ERROR)


def http_options(settings: Settings) -> dict[str, Any]:
    """How a worker reads HTTP (uvicorn's options; benchmarks/floor_app.py is served the same way)."""
    return {
        "loop": "asyncio",
        "http": functools.partial(HeaderDeadline, timeout_s=settings.header_timeout_s),  # h11, with a header deadline
        "ws": "none",  # no WebSocket routes: uvicorn then imports no websocket library
        "access_log": False,  # the app writes one access line per request itself
        "h11_max_incomplete_event_size": settings.max_header_bytes,  # still incomplete beyond it: 400, close
    }


class Master(Arbiter):
    """gunicorn's master, but a stalled worker that is stopped (SIGSTOP, a debugger) is killed at once: gunicorn's
    SIGABRT would wait for a SIGCONT, and the SIGKILL that follows comes a turn of its loop (about 1 s) later."""

    def kill_worker(self, pid: int, sig: int) -> None:
        with contextlib.suppress(OSError):  # the worker's state in /proc: T (stopped) or t (traced)
            if sig == signal.SIGABRT and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "Tt":
                sig = signal.SIGKILL
        super().kill_worker(pid, sig)


class Gunicorn(BaseApplication):
    """gunicorn configured from Settings, serving `factory(settings)` (default: `create_app`) in each worker."""

    temporary_metrics: str | None = None  # the workers' metrics folder open_metrics made (close_metrics removes it)

    def __init__(self, settings: Settings, factory: Callable[[Settings], FastAPI] | None = None) -> None:
        self.settings, self.factory = settings, factory
        super().__init__()

    def load_config(self) -> None:
        settings = self.settings
        formatter = "JsonFormatter" if settings.log_format == "json" else "TextFormatter"
        to_stderr = {"handlers": ["stderr"], "level": settings.log_level.upper(), "propagate": False}
        handler = {"class": "logging.StreamHandler", "formatter": "mnemo", "stream": "ext://sys.stderr"}
        options = {
            "bind": [settings.address(settings.port)],
            "workers": settings.workers,
            # A socket of its own per worker (SO_REUSEPORT), so the kernel spreads new connections over the workers:
            # on one shared socket, asyncio's accept loop lets the first worker to wake take a whole burst.
            "reuse_port": True,
            "worker_class": f"{Worker.__module__}.{Worker.__qualname__}",
            "timeout": math.ceil(settings.worker_stall_s),  # gunicorn takes whole seconds
            "graceful_timeout": math.ceil(settings.drain_s + SHUTDOWN_GRACE_S + GIVE_UP_S) + 1,
            "logconfig_dict": {  # over gunicorn's CONFIG_DEFAULTS (dictConfig version 1, existing loggers kept)
                "formatters": {"mnemo": {"()": f"app.core.logging.{formatter}"}},
                "handlers": {"stderr": handler},
                "root": {"level": "WARNING", "handlers": []},  # not gunicorn's default, which names its own handler
                "loggers": {"gunicorn.error": to_stderr, "uvicorn": to_stderr},  # their access logs off: the app's
            },
            "control_socket_disable": True,  # no runtime control of the workers from outside
        }
        # One worker keeps its metrics in memory, with the per-process ones (memory, CPU, files), as one process does.
        if settings.workers > 1 or os.environ.get(METRICS_DIR):  # the workers' metrics are summed from its files
            hooks = {"on_starting": open_metrics, "child_exit": drop_metrics, "on_exit": close_metrics}
            options |= hooks  # settings, not set by on_starting: a reload rebuilds the settings but runs it no more
        for key, value in options.items():
            self.cfg.set(key, value)

    def run(self) -> None:
        arbiter = self.arbiter = Master(self)
        halt = arbiter.run  # both exit the process
        while True:
            try:
                halt()
            except HaltServer as error:  # another worker failed to boot while gunicorn halted for the first: again
                halt = functools.partial(arbiter.halt, error.reason, error.exit_status)

    def load(self) -> FastAPI:
        """In each worker: the app."""
        tune_malloc()  # before any thread starts
        if (factory := self.factory) is None:
            from app.main import create_app as factory
        return factory(self.settings)


LISTENER_OPTIONS = (
    (socket.SOL_SOCKET, socket.SO_REUSEADDR),
    (socket.SOL_SOCKET, socket.SO_REUSEPORT),
    (socket.IPPROTO_TCP, socket.TCP_NODELAY),
)


def unlistened(listener: Any) -> socket.socket:
    """A socket bound where gunicorn's `listener` is (SO_REUSEPORT), with its options, but not listening: the kernel
    would hand a booting worker's socket connections while its models load. `listener` is closed."""
    fresh = socket.socket(listener.family, socket.SOCK_STREAM)
    for option in LISTENER_OPTIONS:  # as gunicorn set them (TCP_NODELAY: connections inherit it; no Nagle delay)
        fresh.setsockopt(*option, listener.getsockopt(*option))
    fresh.bind(listener.getsockname())
    fresh.setblocking(False)
    listener.close()
    return fresh


def open_metrics(server: Arbiter) -> None:
    """gunicorn's on_starting hook: PROMETHEUS_MULTIPROC_DIR emptied of an earlier run's files, or a temporary one."""
    if not (chosen := os.environ.get(METRICS_DIR)):
        os.environ[METRICS_DIR] = server.app.temporary_metrics = chosen = tempfile.mkdtemp(prefix="mnemo-metrics-")
    elif not Path(chosen).is_dir():
        sys.exit(f"mnemo: cannot start: {METRICS_DIR}={chosen} is not a directory")
    for stale in Path(chosen).glob("*.db"):  # an earlier run's counters would be added to this run's
        stale.unlink()
    server.log.info("metrics of every worker in %s", chosen)


def close_metrics(server: Arbiter) -> None:
    """gunicorn's on_exit hook (in the master): the temporary metrics folder removed."""
    if server.app.temporary_metrics:
        shutil.rmtree(server.app.temporary_metrics, ignore_errors=True)


def drop_metrics(server: Arbiter, worker: Worker) -> None:
    """gunicorn's child_exit hook: the live gauges of a worker that exited are dropped."""
    from prometheus_client.multiprocess import mark_process_dead  # not before open_metrics: it reads the variable

    mark_process_dead(worker.pid)
