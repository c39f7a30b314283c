"""Prometheus metrics of one app instance (its own registry, so several apps can coexist in tests).

Names follow Prometheus conventions: `_total` counters, `_seconds` durations, base units.

With several workers (MNEMO_WORKERS > 1, app/server.py) each worker process writes its values to
files in PROMETHEUS_MULTIPROC_DIR (prometheus_client's multiprocess mode) and `/metrics`, whichever worker
answers it, adds up every worker's files: counters and histograms sum, the gauges follow their
`multiprocess_mode` (rows and requests in flight sum over the live workers, a model is ready when it is
ready in every live worker). Per-process collectors cannot be added up, so `process_*` are left out then;
`mnemo_worker_start_time_seconds{pid}` lists the live workers instead.

A scrape is rendered off the event loop, on a thread of its own (`Metrics.scrape`): the text grows with the
series (every route and method seen, and the files of dead workers merged), and rendered on the loop it would
hold up every other request. Scrapes that arrive during a render share the next one, so a
scrape flood runs one render at a time and takes one thread, never the threads that parse requests.
"""

from __future__ import annotations

import asyncio
import os
import time
from concurrent.futures import ThreadPoolExecutor

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_render_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="metrics-render")
# Why the server refused a request (429 or 503) before any model was chosen: mnemo_server_requests_rejected_total.
# The refusals of a model (its queue full, its deadline, not ready) are mnemo_requests_rejected_total{model,reason}.
SERVER_REJECT_REASONS = (
    "bodies_in_memory",  # 429: the request bodies held at once would pass 32 MB (app/transports/middleware.py)
    "parse_queue_full",  # 429: the bodies waiting to be parsed pass 4 MB (app/runtime/offload.py)
    "draining",  # 503: shutting down, no new requests
    "drain_timeout",  # 503: given up by the drain after MNEMO_DRAIN_S
    "store_busy",  # 429: the student store's calls waiting pass their limit (app/students/io.py)
    "store_unavailable",  # 503: the student store cannot be reached or failed
)


class Metrics:
    """HTTP requests and latency, inference time, and the engine: queues, batches, rejections, readiness."""

    def __init__(self) -> None:
        self.multiprocess_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None
        self._request_series: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}  # see observe_request
        self._rendering: asyncio.Task[bytes] | None = None  # the render running (scrape)
        self._next_render: asyncio.Task[bytes] | None = None  # the render that starts when it ends
        self.registry = registry = CollectorRegistry()
        if self.multiprocess_dir is None:
            ProcessCollector(registry=registry)  # process_cpu_seconds_total, process_resident_memory_bytes, fds...
            PlatformCollector(registry=registry)  # python_info
        else:
            Gauge(
                "mnemo_worker_start_time_seconds",
                "Unix time this worker built its app; one series per live worker (label pid)",
                registry=registry,
                multiprocess_mode="liveall",
            ).set(time.time())
        self.build_info = Gauge(
            "mnemo_build_info", "1; the service version", ["version"], registry=registry, multiprocess_mode="max"
        )
        self.model_info = Gauge(
            "mnemo_model_info",
            "1 per served model: its version and ONNX sha256",
            ["model", "version", "sha256"],
            registry=registry,
            multiprocess_mode="max",
        )
        self.requests = Counter(
            "mnemo_http_requests", "HTTP requests", ["route", "method", "status"], registry=registry
        )
        self.latency = Histogram(
            "mnemo_http_request_duration_seconds",
            "HTTP request latency, queueing included",
            ["route", "method"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.grpc_requests = Counter(
            "mnemo_grpc_requests",
            "gRPC calls (MNEMO_GRPC_PORT) by method and status code",
            ["method", "code"],
            registry=registry,
        )
        self.grpc_latency = Histogram(
            "mnemo_grpc_request_duration_seconds",
            "gRPC call latency, queueing included",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.in_flight = Gauge(
            "mnemo_http_requests_in_flight",
            "HTTP requests being handled",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.inference = Histogram(
            "mnemo_inference_duration_seconds",
            "ONNX Runtime time per completed run",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.queue_depth = Gauge(
            "mnemo_queue_depth", "rows waiting for a run", ["model"], registry=registry, multiprocess_mode="livesum"
        )
        self.admitted_rows = Gauge(
            "mnemo_admitted_rows",
            "rows admitted and not yet answered (bounded by MNEMO_MAX_QUEUE per worker)",
            ["model"],
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.batch_size = Histogram(
            "mnemo_batch_size_rows",
            "rows per completed ONNX run (the runs mnemo_inference_duration_seconds times)",
            ["model"],
            buckets=BATCH_BUCKETS,
            registry=registry,
        )
        self.instance_runs = Counter(
            "mnemo_instance_runs",
            "completed ONNX runs per instance of a model (MNEMO_PROVIDER lists the instances; chain chunks count)",
            ["model", "model_instance"],
            registry=registry,
        )
        self.instance_rows = Counter(
            "mnemo_instance_rows",
            "rows computed per instance of a model",
            ["model", "model_instance"],
            registry=registry,
        )
        self.queue_wait = Histogram(
            "mnemo_queue_wait_seconds",
            "time a queue item (a request's rows, or a part of at most MNEMO_MAX_BATCH of them) waited from "
            "submission to the start of its run, or until it was given up (deadline, client gone, shutdown)",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.rejected = Counter(
            "mnemo_requests_rejected",
            "requests a model refused before any work (429, or 503 when it is not ready)",
            ["model", "reason"],
            registry=registry,
        )
        self.server_rejected = Counter(
            "mnemo_server_requests_rejected",
            "requests the server refused (429 or 503) before any model was chosen",
            ["reason"],
            registry=registry,
        )
        for reason in SERVER_REJECT_REASONS:  # every reason listed from the start, at 0
            self.server_rejected.labels(reason)
        self.timed_out = Counter(
            "mnemo_requests_timed_out", "requests past MNEMO_REQUEST_TIMEOUT_S", ["model"], registry=registry
        )
        self.oom_splits = Counter(
            "mnemo_oom_splits",
            "batches the device could not hold, split in halves and run again (docs/gpu.md)",
            ["model"],
            registry=registry,
        )
        self.cancelled = Counter(
            "mnemo_requests_cancelled", "requests whose client left before the answer", ["model"], registry=registry
        )
        self.header_timeouts = Counter(
            "mnemo_header_timeouts",
            "connections closed because a request's headers were not in by MNEMO_HEADER_TIMEOUT_S",
            registry=registry,
        )
        self.loop_lag = Gauge(
            "mnemo_event_loop_lag_seconds",
            "how late the event loop runs its timers: the recent maximum, halving in about 1 s once it keeps up",
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.model_ready = Gauge(
            "mnemo_model_ready",
            "1 when the model is loaded and warmed (in every live worker)",
            ["model"],
            registry=registry,
            multiprocess_mode="livemin",
        )

    def record_build(self, version: str, models: dict[str, tuple[str, str]]) -> None:
        """The service version and, per model name, its (version, sha256)."""
        self.build_info.labels(version).set(1)
        for name, (model_version, sha256) in models.items():
            self.model_info.labels(name, model_version, sha256).set(1)

    def observe_request(self, route: str, method: str, status: int, seconds: float) -> None:
        key = (route, method, status)
        series = self._request_series.get(key)
        if series is None:  # bound once per route, method and status: labels() costs more than the update
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
        """`render()` on the render thread, shared: a scrape waits for the next render to start (so it sees every
        update made before it arrived), and that render answers every scrape that arrives until it starts."""
        if self._next_render is None:
            self._next_render = asyncio.create_task(self._render_after(self._rendering))
        return await asyncio.shield(self._next_render)  # a scrape that is cancelled leaves the render to the others

    async def _render_after(self, previous: asyncio.Task[bytes] | None) -> bytes:
        if previous is not None:
            await asyncio.wait([previous])
        self._rendering, self._next_render = self._next_render, None
        try:
            return await asyncio.get_running_loop().run_in_executor(_render_thread, self.render)
        finally:
            self._rendering = None
