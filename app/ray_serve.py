"""`python -m app.ray_serve`: the same FastAPI app on Ray Serve replicas (optional extra `ray`), behind Ray's HTTP
proxy on MNEMO_HOST:MNEMO_PORT. Each replica reserves `--cpus-per-replica` CPUs and runs that many ONNX Runtime
threads, one run at a time; each response names its replica (`X-Mnemo-Replica`, `X-Mnemo-Pid`).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import threading
from typing import Any

import click

from app.cli import settings_from
from app.core.settings import Settings

LOCAL_OBJECT_STORE_BYTES = 256 * 1024 * 1024  # requests and responses are small; Ray's default is 30% of RAM
DEPLOYMENT_NAME = "mnemo"


def replica_app(settings: dict[str, Any]) -> Any:
    """The service's FastAPI app for one replica, its responses tagged with the replica's identity."""
    from ray import serve

    from app.main import create_app
    from app.transports.identity import IdentityHeaders

    app = create_app(Settings(**settings))
    app.add_middleware(IdentityHeaders, extra={"X-Mnemo-Replica": serve.get_replica_context().replica_id.unique_id})
    return app


def deployment_options(replicas: int, max_replicas: int | None, target_ongoing: float, cpus: int) -> dict:
    """Ray Serve deployment options: a fixed replica count, or autoscaling from `replicas` to `max_replicas`."""
    options: dict[str, Any] = {"ray_actor_options": {"num_cpus": cpus}}
    if max_replicas is None:
        options["num_replicas"] = replicas
    else:
        options["autoscaling_config"] = {
            "min_replicas": replicas,
            "initial_replicas": replicas,
            "max_replicas": max_replicas,
            "target_ongoing_requests": target_ongoing,
        }
    return options


def build_application(settings: Settings, options: dict[str, Any]) -> Any:
    """The Ray Serve application: one deployment whose replicas each run `replica_app(settings)`."""
    from ray import serve

    @serve.deployment(name=DEPLOYMENT_NAME, **options)
    @serve.ingress()
    class MnemoReplica:
        def __init__(self, replica_settings: dict[str, Any]) -> None:
            self.replica_settings = replica_settings

        def __serve_build_asgi_app__(self) -> Any:
            return replica_app(self.replica_settings)

    return MnemoReplica.bind(settings.model_dump(mode="json"))


def start_ray(address: str | None) -> None:
    """Join `address`, or start a single-node Ray instance that talks over the loopback interface only."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if not address:
        # Ray otherwise replaces 127.0.0.1 by the host's routable address so that other nodes could join;
        # with multi-node clusters disabled its processes reach each other on 127.0.0.1. Read at import.
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray

    if address:
        ray.init(address=address)
    else:
        ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, object_store_memory=LOCAL_OBJECT_STORE_BYTES)


@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("--replicas", type=click.IntRange(min=1), default=2, help="Replicas (the minimum when autoscaling).")
@click.option("--max-replicas", type=click.IntRange(min=1), help="Autoscale up to this many replicas.")
@click.option(
    "--target-ongoing-requests",
    type=click.FloatRange(min=0, min_open=True),
    default=2.0,
    help="Autoscaling: requests in flight per replica.",
)
@click.option("--cpus-per-replica", type=click.IntRange(min=1), default=1, help="CPUs = ONNX Runtime threads.")
@click.option("--address", help="An existing Ray cluster (e.g. auto); default: a local Ray instance on 127.0.0.1.")
def main(
    replicas: int, max_replicas: int | None, target_ongoing_requests: float, cpus_per_replica: int, address: str | None
) -> None:
    """Check the settings, start Ray and Serve, deploy, then serve until SIGINT or SIGTERM."""
    if max_replicas is not None and max_replicas < replicas:
        raise click.BadParameter("must be at least --replicas", param_hint="--max-replicas")
    # a replica is one process running its reserved CPUs as ONNX Runtime threads, one run at a time
    settings = settings_from({"intra_op_threads": cpus_per_replica, "concurrent_runs": 1, "workers": 1})
    if importlib.util.find_spec("ray") is None:
        sys.exit("mnemo: Ray Serve is not installed: pip install -e '.[ray]'")

    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    start_ray(address)
    import ray
    from ray import serve

    try:
        serve.start(http_options={"host": settings.host, "port": settings.port})
        options = deployment_options(replicas, max_replicas, target_ongoing_requests, cpus_per_replica)
        serve.run(build_application(settings, options), name=DEPLOYMENT_NAME, route_prefix="/")
        print(f"mnemo: serving on http://{settings.host}:{settings.port} with Ray Serve ({options})", flush=True)
        stop.wait()
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
