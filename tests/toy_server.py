"""`python -m tests.toy_server`: the toy app (slow toy graphs) served as `python -m app` serves it (MNEMO_*)."""

from __future__ import annotations

from fastapi import FastAPI

from app.frame.settings import Settings
from app.server import serve


def toy(settings: Settings) -> FastAPI:
    """The toy app, built in the worker: this process imports no ONNX Runtime before gunicorn forks it."""
    from tests.toy_model import toy_app

    return toy_app(settings)


if __name__ == "__main__":
    serve(Settings(), toy)
