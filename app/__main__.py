"""`python -m app`: serve with uvicorn on MNEMO_HOST:MNEMO_PORT; a bad provider fails before serving."""

from __future__ import annotations

import sys

import uvicorn
from pydantic import ValidationError

from app.providers import ProviderUnavailable, resolve_provider
from app.settings import Settings


def main() -> None:
    """Check the settings and the provider (one clear message and exit 1 if wrong), then serve."""
    try:
        settings = Settings()
        resolve_provider(settings.provider)
    except ValidationError as error:
        problems = "; ".join(f"MNEMO_{'.'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in error.errors())
        sys.exit(f"mnemo: cannot start: invalid settings: {problems}")
    except ProviderUnavailable as error:
        sys.exit(f"mnemo: cannot start: {error}")
    # access_log=False: the app logs one access line per request itself (app/middleware.py)
    uvicorn.run("app.main:app", host=settings.host, port=settings.port, log_level=settings.log_level, access_log=False)


if __name__ == "__main__":
    main()
