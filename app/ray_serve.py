"""`python -m app.ray_serve`: the app on Ray Serve replicas (extra `ray`), behind Ray's HTTP proxy on
MNEMO_HOST:MNEMO_PORT, with the settings' flags of `mnemo serve`; a replica runs one run on its CPUs' threads."""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

import click

from app.cli import CONTEXT, settings_from, settings_option
from app.core.settings import Settings

LOCAL_OBJECT_STORE_BYTES = 256 * 1024 * 1024  # requests and responses are small; Ray's default is 30% of RAM
DEPLOYMENT_NAME = "mnemo"
FIXED = ("workers", "concurrent_runs", "intra_op_threads")  # a replica: one process, one run of its CPUs' threads


@click.command(context_settings=CONTEXT)
@click.option("--replicas", type=click.IntRange(1), default=2, help="Replicas (the minimum when autoscaling).")
@click.option("--max-replicas", type=click.IntRange(1), help="Autoscale up to this many replicas.")
@click.option(
    "--target-ongoing-requests",
    type=click.FloatRange(0, min_open=True),
    default=2.0,
    help="Autoscaling: requests in flight per replica.",
)
@click.option("--cpus-per-replica", type=click.IntRange(1), default=1, help="CPUs = ONNX Runtime threads.")
@click.option("--address", help="An existing Ray cluster (e.g. auto); default: a local Ray instance on 127.0.0.1.")
def main(
    replicas: int,
    max_replicas: int | None,
    target_ongoing_requests: float,
    cpus_per_replica: int,
    address: str | None,
    **flags: Any,
) -> None:
    """Check the settings, start Ray and Serve, deploy, then serve until SIGINT or SIGTERM."""
    if max_replicas is not None and max_replicas < replicas:
        raise click.BadParameter("must be at least --replicas", param_hint="--max-replicas")
    settings = settings_from({**flags, "intra_op_threads": cpus_per_replica, "concurrent_runs": 1, "workers": 1})
    scaling = {"min_replicas": replicas, "initial_replicas": replicas, "max_replicas": max_replicas or replicas}
    autoscaling = {**scaling, "target_ongoing_requests": target_ongoing_requests}  # none while min = max
    options = {"ray_actor_options": {"num_cpus": cpus_per_replica}, "autoscaling_config": autoscaling}
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if not address:
        # else Ray gives its processes the host's routable address for other nodes; they use 127.0.0.1. Read at import.
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    try:
        import ray
        from ray import serve
    except ImportError:
        sys.exit("mnemo: Ray Serve is not installed: pip install -e '.[ray]'")

    def replica_app() -> Any:  # in each replica (pickled whole: the settings keep their API keys), naming it
        from app.main import create_app

        return create_app(settings, identity={"X-Mnemo-Replica": serve.get_replica_context().replica_id.unique_id})

    local = {"include_dashboard": False, "object_store_memory": LOCAL_OBJECT_STORE_BYTES}  # a Ray of its own
    ray.init(address=address, **({} if address else local))
    try:
        serve.start(http_options={"host": settings.host, "port": settings.port})
        deployment = serve.deployment(name=DEPLOYMENT_NAME, **options)(serve.ingress(replica_app)())
        serve.run(deployment.bind(), name=DEPLOYMENT_NAME, route_prefix="/")
        print(f"mnemo: serving on http://{settings.address(settings.port)} with Ray Serve ({options})", flush=True)
        stop.wait()
    finally:
        serve.shutdown()
        ray.shutdown()


main.params += [settings_option(name, field) for name, field in Settings.model_fields.items() if name not in FIXED]

if __name__ == "__main__":
    main()
