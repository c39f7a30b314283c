"""SIGTERM or SIGHUP during the imports of `python -m app`: stop at once, with status 0 (nothing to drain yet).

As PID 1 in a container the process would otherwise ignore them: a `docker stop` during the imports waited for
SIGKILL. The server (app/server.py) then installs its draining handlers.
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
