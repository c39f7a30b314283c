"""One worker of `python -m app` with MNEMO_WORKERS > 1: started by app/supervisor.py, never by hand.

python -m app.worker --ready-fd M --supervisor-pid P

The worker reads the same MNEMO_* settings as its supervisor, builds its own app (models, engine, run
slots: its share of the thread budget) and serves it with the single-process server (app/server.py,
graceful drain included) on its own socket bound to MNEMO_HOST:MNEMO_PORT with SO_REUSEPORT; the socket
listens only once the app has started. Then the worker writes one byte to fd M, and another every
HEARTBEAT_S from its event loop: a worker whose loop stops (SIGSTOP, a deadlock) goes silent, and the
supervisor replaces it after MNEMO_WORKER_STALL_S. Its responses carry
`X-Mnemo-Pid`. If the supervisor dies, the kernel sends the worker PARENT_GONE (SIGUSR1), so it drains
and exits instead of serving on alone. Not SIGTERM: Linux sends it at each change of parent (the supervisor's
other thread, then init or a subreaper), and a second SIGTERM would cut the drain short.
"""

from __future__ import annotations

from app.stop_signals import stop_until_serving

stop_until_serving()  # first: the imports below take about half a second (app/stop_signals.py)

import argparse
import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import os
import signal

from app.core.logging import write_out_logs
from app.core.settings import Settings
from app.server import serve
from app.supervisor import bind_port
from app.transports.identity import IdentityHeaders

logger = logging.getLogger("mnemo.worker")
PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h)
HEARTBEAT_S = 1.0
PARENT_GONE = signal.SIGUSR1  # the supervisor died: drain once, however many times it comes (app/server.py)


def terminate_with_parent(parent_pid: int) -> None:
    """Ask Linux for PARENT_GONE when the supervisor dies; if it is already gone, stop at once (elsewhere: no-op)."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name, use_errno=True) if name else None
    if libc is None or not hasattr(libc, "prctl") or libc.prctl(PR_SET_PDEATHSIG, PARENT_GONE, 0, 0, 0) != 0:
        return
    if os.getppid() != parent_pid:  # it died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def beat(fd: int, loop: asyncio.AbstractEventLoop) -> None:
    """One byte to the supervisor now and every HEARTBEAT_S while the event loop turns."""
    with contextlib.suppress(OSError):  # the supervisor is gone (PARENT_GONE is on the way) or not reading
        os.write(fd, b"1")
    loop.call_later(HEARTBEAT_S, beat, fd, loop)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ready-fd", type=int, required=True, help="one byte is written here once serving")
    parser.add_argument("--supervisor-pid", type=int, required=True, help="the parent; its death drains the worker")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    terminate_with_parent(args.supervisor_pid)
    settings = Settings()  # the supervisor checked these very variables before starting the workers
    sock = bind_port(settings.host, settings.port, shared=True)  # uvicorn calls listen() after the app's startup

    def started() -> None:
        logger.info(
            "worker %d serving: %d concurrent run(s) x %d intra-op thread(s)",
            os.getpid(),
            settings.concurrent_runs,
            settings.intra_op_threads,
        )
        write_out_logs()  # this line before the supervisor's "all N workers ready": a worker killed now keeps it
        os.set_blocking(args.ready_fd, False)  # a supervisor that stopped reading never blocks the loop
        beat(args.ready_fd, asyncio.get_running_loop())

    from app.main import create_app

    app = create_app(settings)
    app.add_middleware(IdentityHeaders)
    serve(settings, app, sockets=[sock], on_started=started, parent_gone_signal=PARENT_GONE)


if __name__ == "__main__":
    main()
