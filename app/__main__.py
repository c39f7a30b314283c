"""`python -m app`: serve with uvicorn on MNEMO_HOST:MNEMO_PORT; bad settings or provider fail before serving.

With MNEMO_WORKERS > 1 a supervisor runs that many server processes on the port (app/supervisor.py).
"""

from __future__ import annotations

from app.stop_signals import stop_until_serving

stop_until_serving()  # first: the imports below take about half a second (app/stop_signals.py)

import argparse
import os
import sys

from pydantic import ValidationError

from app.core.settings import Settings, unknown_variables
from app.runtime.memory import tune_malloc
from app.runtime.providers import ProviderUnavailable, resolve_provider
from app.runtime.sessions import preopened
from app.students.factory import check_url


def _problem(error: dict) -> str:
    """One settings error: `MNEMO_NAME: message`, or a rule across settings (it names them itself) alone."""
    if not error["loc"]:  # a model validator's ValueError: pydantic prefixes "Value error, "
        return str(error["msg"]).removeprefix("Value error, ")
    return f"MNEMO_{'.'.join(map(str, error['loc'])).upper()}: {error['msg']}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """`--help` prints how to configure; any argument is refused (exit 2): the settings are MNEMO_* variables."""
    parser = argparse.ArgumentParser(
        prog="python -m app",
        description="Serve the models of MNEMO_ARTIFACTS_DIR over HTTP on MNEMO_HOST:MNEMO_PORT.",
        epilog="It takes no arguments: every setting is an MNEMO_* environment variable (README.md, Configuration).",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Check the settings and the provider (one clear message and exit 1 if wrong), then serve."""
    parse_args(argv)
    try:
        settings = Settings()
        resolve_provider(settings.provider)
    except ValidationError as error:
        problems = "; ".join(_problem(e) for e in error.errors())
        sys.exit(f"mnemo: cannot start: invalid settings: {problems}")
    except ProviderUnavailable as error:
        sys.exit(f"mnemo: cannot start: {error}")
    for line in unknown_variables(os.environ):
        print(f"mnemo: warning: {line}", file=sys.stderr)
    problem = startup_problem(settings)
    if problem:
        sys.exit(f"mnemo: cannot start: {problem}")
    from app.supervisor import CannotStart, bind_port, supervise  # it imports neither uvicorn nor the app

    try:  # the addresses first: a port in use or a host that does not resolve stops startup before any model
        if settings.probe_port is not None:
            bind_port(settings.host, settings.probe_port, names="MNEMO_HOST:MNEMO_PROBE_PORT").close()
        sockets = [bind_port(settings.host, settings.port)] if settings.workers == 1 else []
    except CannotStart as error:
        sys.exit(f"mnemo: cannot start: {error}")
    if settings.workers == 1:
        tune_malloc()  # before any thread starts (serve() repeats it for the other callers)
        preopened.start(settings)  # ONNX sessions open while the web stack imports
        from app.server import serve

        serve(settings, sockets=sockets)
        return

    try:
        sys.exit(supervise(settings))
    except CannotStart as error:
        sys.exit(f"mnemo: cannot start: {error}")


def startup_problem(settings: Settings) -> str | None:
    """What is wrong with settings that only make sense together with the files and URLs they name."""
    manifest = settings.artifacts_dir / "manifest.json"
    if not manifest.is_file():
        return f"MNEMO_ARTIFACTS_DIR {settings.artifacts_dir} holds no manifest.json"
    try:
        check_url(settings.state_url)
    except ValueError as error:
        return str(error)
    return None


if __name__ == "__main__":
    main()
