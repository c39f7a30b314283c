"""`python -m tests.toy_server`: the toy app behind the real DrainingServer, settings from MNEMO_*.

A run with a row of k == HELD_K (tests/toy_model.py) waits until the process gets SIGUSR1: tests hold the run
slot with it for exactly as long as they need.
"""

from __future__ import annotations

import signal

from app.core.settings import Settings
from app.server import serve
from tests.toy_model import HeldRuns, toy_app

if __name__ == "__main__":
    settings = Settings()
    held = HeldRuns()
    signal.signal(signal.SIGUSR1, lambda signum, frame: held.release())
    serve(settings, toy_app(settings, prepare=held.prepare))
