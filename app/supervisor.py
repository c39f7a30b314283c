"""Several workers on one port: what `python -m app` runs when MNEMO_WORKERS > 1.

The supervisor starts MNEMO_WORKERS processes (app/worker.py), each the single-process server with its
own models and its share of the thread budget, each listening on MNEMO_HOST:MNEMO_PORT with its own
socket and SO_REUSEPORT, so the kernel spreads new connections evenly over the workers that listen. A
worker listens only once its models are ready. One socket shared by all workers was tried first and
rejected: asyncio accepts every waiting connection at each wake-up, so the first worker to wake took all
32 connections of a burst and the other stayed idle. What SO_REUSEPORT costs: connections waiting in a
worker's own accept queue when it closes its socket (the end of its drain, or a crash) are reset, which
Linux avoids with `sysctl net.ipv4.tcp_migrate_req=1`. The worker accepts them as they come, draining
included, so that queue is short. The supervisor binds the port too, without listening (it gets no
connections), so a port in use fails before any model loads and no other program takes the port while a
worker is replaced.

Signals: SIGTERM, SIGINT or SIGHUP (no reload: a drain like SIGTERM's) is passed on to every worker,
which drains like a single server (`/ready` 503, new requests 503, admitted requests answered, exit 0); a
second signal is passed on too and stops the waiting. The workers run in their own session, so a
terminal's Ctrl-C reaches them only through the supervisor, once; if the supervisor dies, each worker
gets SIGUSR1 and drains, once however often it comes (app/worker.py).

Failures: at startup, a worker that exits before it serves (a model that fails to load, say) stops the
others and the supervisor exits with status 1, rather than restarting it in a loop. A worker that dies
after serving is replaced, and so is one whose heartbeat (a byte a second on its ready pipe, from its
event loop) stops for MNEMO_WORKER_STALL_S: it is killed first. A replacement that exits before it serves
(an artifact changed on disk since startup, say) is started again after 1 s, then 2, 4, ... up to 60 s,
one line logged per failed attempt, while the other workers go on serving; only when no worker is left
serving does the supervisor stop the others and exit 1. The exit status is 0 when every worker exited 0
after the signal.

PID 1: in a container the supervisor is the init process, so the kernel makes it the parent of every orphan,
such as the probe process (MNEMO_PROBE_PORT) of a worker that was killed. It reaps those children too, or
each would stay a zombie for the container's life.

Metrics: the workers write them to PROMETHEUS_MULTIPROC_DIR (app/core/metrics.py): the variable's
directory if set (its `*.db` files from an earlier run are deleted first), else a temporary directory
that the supervisor removes when it exits. A dead worker's live gauges are removed (`mark_process_dead`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from prometheus_client.multiprocess import mark_process_dead

from app.core.logging import configure_logging
from app.core.settings import Settings, usable_cpus

logger = logging.getLogger("mnemo.supervisor")
POLL_S = 0.2
RETRY_FIRST_S = 1.0  # a replacement that failed to start is started again after this, doubled each time
RETRY_MAX_S = 60.0


class CannotStart(Exception):
    """The supervisor cannot start: a message for the operator."""


@dataclass
class Worker:
    process: subprocess.Popen
    ready_pipe: int  # read end: the worker writes one byte once it serves
    replacement: bool  # started in place of a worker that died while serving
    ready: bool = False
    heard_at: float = 0.0  # time.monotonic() of its last byte (one once it serves, then one a second)

    @property
    def pid(self) -> int:
        return self.process.pid


def bind_port(host: str, port: int, *, shared: bool = False, names: str = "MNEMO_HOST:MNEMO_PORT") -> socket.socket:
    """A TCP socket bound to host:port (SO_REUSEADDR, like uvicorn's; SO_REUSEPORT too when `shared` by
    workers), not listening yet; `CannotStart` naming the settings (`names`) when the address cannot be had."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if shared:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise CannotStart(f"cannot listen on {host}:{port} ({names}): {error.strerror}") from None
    return sock


def child_pids() -> set[int]:
    """The pids of this process's children (Linux /proc; empty elsewhere)."""
    pids: set[int] = set()
    with contextlib.suppress(OSError):
        for task in Path("/proc/self/task").iterdir():
            pids.update(int(pid) for pid in (task / "children").read_text().split())
    return pids


@contextmanager
def metrics_directory() -> Iterator[Path]:
    """PROMETHEUS_MULTIPROC_DIR emptied of earlier values, or a temporary directory removed at the end."""
    chosen = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if chosen:
        path = Path(chosen)
        if not path.is_dir():
            raise CannotStart(f"PROMETHEUS_MULTIPROC_DIR={chosen} is not a directory")
        for stale in path.glob("*.db"):  # an earlier run's counters would be added to this run's
            stale.unlink()
        yield path
        return
    path = Path(tempfile.mkdtemp(prefix="mnemo-metrics-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class Supervisor:
    """Starts the workers, passes signals on, replaces a worker that dies while serving; `run` is the exit status."""

    def __init__(self, settings: Settings, metrics_dir: Path) -> None:
        self.settings = settings
        self.metrics_dir = metrics_dir
        self.workers: list[Worker] = []
        self.stopping = False
        self.status = 0
        self.started_at = time.monotonic()
        self.all_ready = False
        self.failed_replacements = 0  # in a row: the backoff's exponent
        self.retry_at: list[float] = []  # when to start a replacement again (time.monotonic())

    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # SIGHUP's default ended it at once
            signal.signal(signum, self._pass_on)
        self.workers = [self._start(replacement=False) for _ in range(self.settings.workers)]
        while self.workers or self.retry_at:
            self._wait_for_news()
            for worker in list(self.workers):
                if worker.process.poll() is not None:
                    self._exited(worker)
            self._reap_orphans()
            self._retry_due()
            self._kill_stalled()
        return self.status

    def _start(self, *, replacement: bool) -> Worker:
        ready_read, ready_write = os.pipe()
        process = subprocess.Popen(
            [sys.executable, "-m", "app.worker", "--ready-fd", str(ready_write), "--supervisor-pid", str(os.getpid())],
            pass_fds=(ready_write,),
            env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(self.metrics_dir)},
            start_new_session=True,  # signals reach the workers through the supervisor only
        )
        os.close(ready_write)
        return Worker(process, ready_read, replacement)

    def _wait_for_news(self) -> None:
        """Wait up to POLL_S for the workers' bytes: the first says it serves, the next that its event loop
        turns (a signal may cut the wait short)."""
        by_pipe = {worker.ready_pipe: worker for worker in self.workers}
        readable, _, _ = select.select(list(by_pipe), [], [], POLL_S)
        for pipe in readable:
            worker = by_pipe[pipe]
            if os.read(pipe, 4096):
                worker.heard_at = time.monotonic()
                if not worker.ready:
                    worker.ready = True
                    self.failed_replacements = 0 if worker.replacement else self.failed_replacements
                    self._log_ready()
            else:  # end of file: the worker is exiting
                with contextlib.suppress(subprocess.TimeoutExpired):
                    worker.process.wait(timeout=1)

    def _kill_stalled(self) -> None:
        """Kill a serving worker silent for MNEMO_WORKER_STALL_S (its event loop stopped): it is replaced. Its
        socket still took its share of new connections, which waited unanswered."""
        if self.stopping:
            return
        silent_since = time.monotonic() - self.settings.worker_stall_s
        for worker in self.workers:
            if worker.ready and worker.heard_at < silent_since and worker.process.poll() is None:
                logger.error(
                    "worker %d silent for %gs (its event loop stopped): killing it",
                    worker.pid,
                    self.settings.worker_stall_s,
                )
                worker.process.kill()

    def _reap_orphans(self) -> None:
        """Reap the exited children that are not workers: orphans the kernel gave this process (PID 1)."""
        workers = {worker.pid for worker in self.workers}
        for pid in child_pids() - workers:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)

    def _log_ready(self) -> None:
        ready = sum(worker.ready for worker in self.workers)
        if not self.all_ready and ready == self.settings.workers:
            self.all_ready = True
            logger.info("all %d workers ready in %.1fs", ready, time.monotonic() - self.started_at)

    def _exited(self, worker: Worker) -> None:
        code = worker.process.returncode
        self.workers.remove(worker)
        os.close(worker.ready_pipe)
        mark_process_dead(worker.pid, str(self.metrics_dir))
        if self.stopping:
            logger.info("worker %d exited with status %d", worker.pid, code)
            self.status = self.status or (0 if code == 0 else 1)
        elif worker.ready:
            logger.warning("worker %d died (status %d) while serving: starting another", worker.pid, code)
            self._replace()
        elif worker.replacement and any(other.ready for other in self.workers):
            self._retry_later(worker, code)
        else:
            logger.error("worker %d exited with status %d before it served: stopping the others", worker.pid, code)
            self.status = 1
            self._stop(signal.SIGTERM)

    def _replace(self) -> None:
        replacement = self._start(replacement=True)
        self.workers.append(replacement)
        if self.stopping:  # a signal came while it was being started
            replacement.process.send_signal(signal.SIGTERM)

    def _retry_later(self, worker: Worker, code: int) -> None:
        """Start the failed replacement again after the backoff; the other workers serve meanwhile."""
        self.failed_replacements += 1
        delay_s = min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (self.failed_replacements - 1))
        self.retry_at.append(time.monotonic() + delay_s)
        logger.error(
            "replacement worker %d exited with status %d before it served (attempt %d); %d worker(s) serving; "
            "trying again in %gs",
            worker.pid,
            code,
            self.failed_replacements,
            sum(other.ready for other in self.workers),
            delay_s,
        )

    def _retry_due(self) -> None:
        """Start the replacements whose backoff is over (none once stopping)."""
        now = time.monotonic()
        due = [] if self.stopping else [at for at in self.retry_at if at <= now]
        self.retry_at = [] if self.stopping else [at for at in self.retry_at if at > now]
        for _ in due:
            self._replace()

    def _pass_on(self, signum: int, frame: FrameType | None) -> None:
        logger.info("%s: passing it on to %d worker(s)", signal.Signals(signum).name, len(self.workers))
        self._stop(signum)

    def _stop(self, signum: int) -> None:
        self.stopping = True
        for worker in self.workers:
            if worker.process.poll() is None:
                worker.process.send_signal(signum)


def supervise(settings: Settings) -> int:
    """Serve with `settings.workers` worker processes until a signal; the exit status."""
    configure_logging(settings.log_level, settings.log_format)
    with metrics_directory() as metrics_dir:
        port_holder = bind_port(settings.host, settings.port, shared=True)
        logger.info(
            "supervisor %d: %d workers on http://%s:%d, each with %d concurrent run(s) x %d intra-op thread(s) "
            "of the %d CPUs; metrics of every worker in %s",
            os.getpid(),
            settings.workers,
            settings.host,
            settings.port,
            settings.concurrent_runs,
            settings.intra_op_threads,
            usable_cpus(),
            metrics_dir,
        )
        try:
            return Supervisor(settings, metrics_dir).run()
        finally:
            port_holder.close()
