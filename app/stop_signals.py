"""SIGTERM or SIGHUP before the server's own handlers are installed: stop at once, with status 0.

The entry points (`python -m app`, `python -m app.worker`) call `stop_until_serving` before their imports,
which take about half a second; the server (app/server.py) and the supervisor (app/supervisor.py) then
replace these handlers with their drains. Nothing is in flight yet, so there is nothing to drain. Without a
handler, the kernel ignores these signals for PID 1, as the server is in a container: a `docker stop` or a pod
deleted during the imports waited for the stop timeout, then SIGKILL.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def stop_until_serving() -> None:
    """Make SIGTERM and SIGHUP end the process now (status 0) until the server installs its own handlers."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _stop)


def _stop(signum: int, frame: FrameType | None) -> None:
    print(f"mnemo: {signal.Signals(signum).name} before serving: stopped", file=sys.stderr, flush=True)
    sys.exit(0)
