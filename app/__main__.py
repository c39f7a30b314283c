"""`python -m app`: the same command as `mnemo serve` (app/cli.py): every setting a flag or an MNEMO_* variable."""

from app.stop_signals import stop_until_serving

stop_until_serving()  # first: the imports below take about half a second (app/stop_signals.py)

from app.cli import serve

if __name__ == "__main__":
    serve.main(prog_name="python -m app")  # the arguments: sys.argv[1:]
