"""`python -m tests.toy_server`: the toy app served as `python -m app` serves it (settings from MNEMO_*).

A run with a row of k == HELD_K (tests/toy_model.py) waits until the worker gets SIGUSR1 (gunicorn's master passes
it on to its workers): tests hold the run slot with it for exactly as long as they need.
"""

from __future__ import annotations

import signal

from fastapi import FastAPI

from app.core.settings import Settings
from app.server import Gunicorn


def toy(settings: Settings) -> FastAPI:
    """The toy app, built in the worker: this process imports no ONNX Runtime before gunicorn forks it."""
    from tests.toy_model import HeldRuns, toy_app

    held = HeldRuns()
    signal.signal(signal.SIGUSR1, lambda signum, frame: held.release())
    return toy_app(settings, prepare=held.prepare)


if __name__ == "__main__":
    Gunicorn(Settings(), toy).run()
