"""`python -m tests.toy_server`: the toy app (slow toy graphs) behind the real DrainingServer, settings from MNEMO_*."""

from __future__ import annotations

from app.core.settings import Settings
from app.server import serve
from tests.toy_model import toy_app

if __name__ == "__main__":
    settings = Settings()
    serve(settings, toy_app(settings))
