"""Serve the same FastAPI app with Ray Serve replicas (optional extra `ray`).

python -m app.ray_serve --replicas 2                      # two replicas on a local Ray instance
python -m app.ray_serve --replicas 1 --max-replicas 4     # autoscaling between 1 and 4 replicas
python -m app.ray_serve --address auto --replicas 4       # on a running Ray cluster

Every replica builds `app.main.create_app(settings)` with the settings the launcher read from `MNEMO_*`,
except the thread budget: each replica reserves `--cpus-per-replica` CPUs in Ray (default 1) and runs that
many ONNX Runtime threads, one run at a time, so replicas do not oversubscribe the cores. Ray Serve's HTTP
proxy listens on MNEMO_HOST:MNEMO_PORT and spreads requests over the replicas. Each response names the
replica that answered in `X-Mnemo-Replica` (Ray's replica id) and `X-Mnemo-Pid` (its process id). Ray is
imported only here.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import sys
import threading
from typing import Any

from pydantic import ValidationError

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
        """One replica: holds the settings; Ray builds the ASGI app from them when the replica starts."""

        def __init__(self, replica_settings: dict[str, Any]) -> None:
            self.replica_settings = replica_settings

        def __serve_build_asgi_app__(self) -> Any:
            return replica_app(self.replica_settings)

    return MnemoReplica.bind(settings.model_dump(mode="json"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=2, help="replicas (the minimum when autoscaling); default 2")
    parser.add_argument("--max-replicas", type=int, help="enable autoscaling up to this many replicas")
    parser.add_argument(
        "--target-ongoing-requests", type=float, default=2.0, help="autoscaling: requests in flight per replica"
    )
    parser.add_argument(
        "--cpus-per-replica", type=int, default=1, help="CPUs each replica reserves = its ONNX Runtime threads"
    )
    parser.add_argument(
        "--address", help="an existing Ray cluster (e.g. auto); default: start a local Ray instance on 127.0.0.1"
    )
    args = parser.parse_args(argv)
    if args.replicas < 1:
        parser.error("--replicas must be at least 1")
    if args.max_replicas is not None and args.max_replicas < args.replicas:
        parser.error("--max-replicas must be at least --replicas")
    if args.cpus_per_replica < 1:
        parser.error("--cpus-per-replica must be at least 1")
    if args.target_ongoing_requests <= 0:
        parser.error("--target-ongoing-requests must be positive")
    return args


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


def main(argv: list[str] | None = None) -> None:
    """Check the settings, start Ray and Serve, deploy, then serve until SIGINT or SIGTERM."""
    args = parse_args(argv)
    try:
        # each replica's thread budget: its reserved CPUs as ONNX Runtime threads, one run at a time (the engine's
        # MNEMO_CONCURRENT_RUNS; settings this version does not know are ignored); a replica is one process, so
        # MNEMO_WORKERS does not apply
        settings = Settings(intra_op_threads=args.cpus_per_replica, concurrent_runs=1, workers=1)
    except ValidationError as error:
        problems = "; ".join(f"MNEMO_{'.'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in error.errors())
        sys.exit(f"mnemo: cannot start: invalid settings: {problems}")
    if importlib.util.find_spec("ray") is None:
        sys.exit("mnemo: Ray Serve is not installed: pip install -e '.[ray]'")

    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    start_ray(args.address)
    import ray
    from ray import serve

    try:
        serve.start(http_options={"host": settings.host, "port": settings.port})
        options = deployment_options(
            args.replicas, args.max_replicas, args.target_ongoing_requests, args.cpus_per_replica
        )
        serve.run(build_application(settings, options), name=DEPLOYMENT_NAME, route_prefix="/")
        print(f"mnemo: serving on http://{settings.host}:{settings.port} with Ray Serve ({options})", flush=True)
        stop.wait()
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
