"""`python -m app`: the same command as `mnemo serve` (app/cli.py). Until the server installs its draining handlers,
SIGTERM or SIGHUP stops it at once with status 0: as a container's PID 1 it would otherwise ignore them."""

import signal
import sys


def stop_before_serving(signum: int, frame: object) -> None:
    print(f"mnemo: {signal.Signals(signum).name} before serving: stopped", file=sys.stderr, flush=True)
    sys.exit(0)


for signum in (signal.SIGTERM, signal.SIGHUP):  # first: the imports below take about half a second
    signal.signal(signum, stop_before_serving)

from app.cli import serve

if __name__ == "__main__":
    serve.main(prog_name="python -m app")  # the arguments: sys.argv[1:]
