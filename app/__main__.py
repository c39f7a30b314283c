"""`python -m app`: serve with uvicorn on MNEMO_HOST:MNEMO_PORT; bad settings or provider fail before serving."""

from __future__ import annotations

import sys

from pydantic import ValidationError

from app.frame.providers import ProviderUnavailable, resolve_provider
from app.frame.settings import Settings
from app.server import serve


def main() -> None:
    """Check the settings and the provider (one clear message and exit 1 if wrong), then serve."""
    try:
        settings = Settings()
        resolve_provider(settings.provider)
    except ValidationError as error:
        problems = "; ".join(
            f"MNEMO_{'.'.join(map(str, e['loc'])).upper() or 'SETTINGS'}: {e['msg']}" for e in error.errors()
        )
        sys.exit(f"mnemo: cannot start: invalid settings: {problems}")
    except ProviderUnavailable as error:
        sys.exit(f"mnemo: cannot start: {error}")
    serve(settings)


if __name__ == "__main__":
    main()
