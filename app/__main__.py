"""`python -m app`: serve on MNEMO_HOST:MNEMO_PORT with gunicorn and MNEMO_WORKERS uvicorn workers (app/server.py).

Bad settings or a port in use fail before gunicorn starts, in one line. This process imports no ONNX Runtime: the
workers are forked from it, and ONNX Runtime does not survive a fork (a worker aborted at exit); the workers check
the provider and load the models, and one that cannot stops the server with one line saying why.
"""

from __future__ import annotations

from app.stop_signals import stop_until_serving

stop_until_serving()  # first: the imports below take about half a second (app/stop_signals.py)

import argparse
import os
import socket
import sys

from pydantic import ValidationError

from app.frame.settings import Settings, unknown_variables
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
    except ValidationError as error:
        problems = "; ".join(_problem(e) for e in error.errors())
        sys.exit(f"mnemo: cannot start: invalid settings: {problems}")
    for line in unknown_variables(os.environ):
        print(f"mnemo: warning: {line}", file=sys.stderr)
    problem = startup_problem(settings)
    if problem:
        sys.exit(f"mnemo: cannot start: {problem}")
    for port, names in ((settings.probe_port, "MNEMO_HOST:MNEMO_PROBE_PORT"), (settings.port, "MNEMO_HOST:MNEMO_PORT")):
        problem = port_problem(settings.host, port, names) if port is not None else None
        if problem:
            sys.exit(f"mnemo: cannot start: {problem}")
    from app.server import serve

    serve(settings)


def port_problem(host: str, port: int, names: str) -> str | None:
    """Why host:port cannot be listened on (in use, a host that does not resolve), naming the settings; else None."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn binds it
        try:
            sock.bind((host, port))
        except OSError as error:
            return f"cannot listen on {host}:{port} ({names}): {error.strerror}"
    return None


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
