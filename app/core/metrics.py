"""Prometheus metrics of one app (its own registry); with several workers, prometheus_client's multiprocess mode,
`mnemo_worker_start_time_seconds{pid}` standing for the `process_*` collectors, which cannot be added up."""

from __future__ import annotations

import asyncio
import functools
import os
import time
from concurrent.futures import ThreadPoolExecutor

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
MODEL = ("model",)  # the label of most series
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_render_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="metrics-render")
# Why the server refused a request (429 or 503) before any model was chosen: mnemo_server_requests_rejected_total.
# The refusals of a model (its queue full, its deadline, not ready) are mnemo_requests_rejected_total{model,reason}.
SERVER_REJECT_REASONS = (
    "bodies_in_memory",  # 429: the request bodies held at once would pass 32 MB (app/transports/middleware.py)
    "parse_queue_full",  # 429: the bodies waiting to be parsed pass 4 MB (app/runtime/offload.py)
    "draining",  # 503: shutting down, no new requests
    "drain_timeout",  # 503: given up by the drain after MNEMO_DRAIN_S
    "connections",  # 503: more connections open than MNEMO_MAX_CONNECTIONS (app/transports/middleware.py)
    "store_busy",  # 429: the student store's calls waiting pass their limit (app/students/io.py)
    "store_unavailable",  # 503: the student store cannot be reached or failed
)


class Metrics:
    """HTTP requests and latency, inference time, and the engine: queues, batches, rejections, readiness."""

    def __init__(self) -> None:
        self.multiprocess_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None
        self._request_series: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}  # see observe_request
        self._rendering = asyncio.Lock()  # one render at a time (scrape)
        self._next_render: asyncio.Task[bytes] | None = None  # the render that scrapes arriving now wait for
        self.registry = registry = CollectorRegistry()

        counter = functools.partial(Counter, registry=registry)
        gauge = functools.partial(Gauge, registry=registry, multiprocess_mode="livesum")
        histogram = functools.partial(Histogram, registry=registry, buckets=LATENCY_BUCKETS)
        if self.multiprocess_dir is None:
            ProcessCollector(registry=registry)  # process_cpu_seconds_total, process_resident_memory_bytes, fds...
            PlatformCollector(registry=registry)  # python_info
        else:
            start = "Unix time this worker built its app; one series per live worker (label pid)"
            gauge("mnemo_worker_start_time_seconds", start, multiprocess_mode="liveall").set(time.time())
        self.build_info = gauge("mnemo_build_info", "1; the service version", ["version"], multiprocess_mode="max")
        info = "1 per served model: its version and ONNX sha256"
        self.model_info = gauge("mnemo_model_info", info, ["model", "version", "sha256"], multiprocess_mode="max")
        self.requests = counter("mnemo_http_requests", "HTTP requests", ["route", "method", "status"])
        latency = "HTTP request latency, queueing included"
        self.latency = histogram("mnemo_http_request_duration_seconds", latency, ["route", "method"])
        grpc = "gRPC calls (MNEMO_GRPC_PORT) by method and status code"
        self.grpc_requests = counter("mnemo_grpc_requests", grpc, ["method", "code"])
        grpc_latency = "gRPC call latency, queueing included"
        self.grpc_latency = histogram("mnemo_grpc_request_duration_seconds", grpc_latency, ["method"])
        self.in_flight = gauge("mnemo_http_requests_in_flight", "HTTP requests being handled")
        self.inference = histogram("mnemo_inference_duration_seconds", "ONNX Runtime time per completed run", MODEL)
        self.queue_depth = gauge("mnemo_queue_depth", "rows waiting for a run", MODEL)
        admitted = "rows admitted and not yet answered (bounded by MNEMO_MAX_QUEUE per worker)"
        self.admitted_rows = gauge("mnemo_admitted_rows", admitted, MODEL)
        batch = "rows per completed ONNX run (the runs mnemo_inference_duration_seconds times)"
        self.batch_size = histogram("mnemo_batch_size_rows", batch, MODEL, buckets=BATCH_BUCKETS)
        runs = "completed ONNX runs per instance of a model (MNEMO_PROVIDER lists the instances; chain chunks count)"
        self.instance_runs = counter("mnemo_instance_runs", runs, ["model", "model_instance"])
        rows = "rows computed per instance of a model"
        self.instance_rows = counter("mnemo_instance_rows", rows, ["model", "model_instance"])
        wait = (
            "time a queue item (a request's rows, or a part of at most MNEMO_MAX_BATCH of them) waited from "
            "submission to the start of its run, or until it was given up (deadline, client gone, shutdown)"
        )
        self.queue_wait = histogram("mnemo_queue_wait_seconds", wait, MODEL)
        rejected = "requests a model refused before any work (429, or 503 when it is not ready)"
        self.rejected = counter("mnemo_requests_rejected", rejected, ["model", "reason"])
        refused = "requests the server refused (429 or 503) before any model was chosen"
        self.server_rejected = counter("mnemo_server_requests_rejected", refused, ["reason"])
        for reason in SERVER_REJECT_REASONS:  # every reason listed from the start, at 0
            self.server_rejected.labels(reason)
        self.timed_out = counter("mnemo_requests_timed_out", "requests past MNEMO_REQUEST_TIMEOUT_S", MODEL)
        splits = "batches the device could not hold, split in halves and run again (docs/gpu.md)"
        self.oom_splits = counter("mnemo_oom_splits", splits, MODEL)
        self.cancelled = counter("mnemo_requests_cancelled", "requests whose client left before the answer", MODEL)
        header = "connections closed because a request's headers were not in by MNEMO_HEADER_TIMEOUT_S"
        self.header_timeouts = counter("mnemo_header_timeouts", header)
        lag = "how late the event loop runs its timers: the recent maximum, halving in about 1 s once it keeps up"
        self.loop_lag = gauge("mnemo_event_loop_lag_seconds", lag, multiprocess_mode="livemax")
        ready = "1 when the model is loaded and warmed (in every live worker)"
        self.model_ready = gauge("mnemo_model_ready", ready, MODEL, multiprocess_mode="livemin")

    def observe_request(self, route: str, method: str, status: int, seconds: float) -> None:
        # bound once per route, method and status: labels() costs more than the update
        if (series := self._request_series.get(key := (route, method, status))) is None:
            series = self._request_series[key] = (
                self.requests.labels(route, method, str(status)),
                self.latency.labels(route, method),
            )
        series[0].inc()
        series[1].observe(seconds)

    def refused(self, reason: str) -> None:
        """Count a refusal made before any model was chosen (one of SERVER_REJECT_REASONS)."""
        self.server_rejected.labels(reason).inc()

    def render(self) -> bytes:
        """The Prometheus text exposition: this process's metrics, or every worker's added up."""
        if self.multiprocess_dir is None:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=self.multiprocess_dir)
        PlatformCollector(registry=registry)  # python_info: the same in every worker
        return generate_latest(registry)

    async def scrape(self) -> bytes:
        """`render()` on the render thread, off the event loop: a scrape waits for the next render to start (so it sees
        every update made before it), and that render answers every scrape that arrives until it starts."""
        if self._next_render is None:
            self._next_render = asyncio.create_task(self._render_next())
        return await asyncio.shield(self._next_render)  # a scrape that is cancelled leaves the render to the others

    async def _render_next(self) -> bytes:
        async with self._rendering:
            self._next_render = None  # it starts: a scrape arriving from now on waits for the next one
            return await asyncio.get_running_loop().run_in_executor(_render_thread, self.render)
