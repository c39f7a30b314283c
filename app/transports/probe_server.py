"""/health and /ready on MNEMO_PROBE_PORT from a child process (`python -m app.transports.probe_server HOST PORT
[STALE_S]`), fed the readiness as `[status, body]` lines on its stdin: a thread of the service's process would wait for
the GIL behind a saturated event loop. No line for STALE_S (the loop stuck) is 503; the end of stdin ends the child."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

logger = logging.getLogger("mnemo.probes")
START_TIMEOUT_S = 10.0
STALE_S = 30.0  # no readiness line for this long: the service's event loop is stuck, not merely busy
MAX_CONNECTIONS = 16  # probe connections served at once; more are closed unanswered
CONNECTION_TIMEOUT_S = 5.0  # a connection's whole life, not only each read: trickled bytes cannot hold a slot for ever


@contextlib.asynccontextmanager
async def probe_process(host: str, port: int, readiness: Callable[[], tuple[int, dict]]) -> AsyncIterator[Callable]:
    """The probe server on `host:port`, listening once entered (it says "loading" while the service loads its models);
    the function yielded tells it `readiness()` (the event loop's heartbeat, also from a signal handler)."""
    command = [sys.executable, "-m", "app.transports.probe_server", host, str(port)]
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    os.set_blocking(process.stdin.fileno(), False)

    def push() -> None:  # one small non-blocking write; ValueError: stdin closed (stopped)
        with contextlib.suppress(BlockingIOError, BrokenPipeError, ValueError):
            process.stdin.write(json.dumps(readiness()) + "\n")
            process.stdin.flush()

    try:
        first = "no answer"
        with contextlib.suppress(TimeoutError):
            first = await asyncio.wait_for(asyncio.to_thread(process.stdout.readline), START_TIMEOUT_S)
        if first.strip() != "listening":  # the port is taken
            raise RuntimeError(f"MNEMO_PROBE_PORT: the probe server did not start: {first.strip() or 'exited'}")
        logger.info("probes: /health and /ready also on http://%s:%d (own process)", host, port)
        yield push
    finally:
        with contextlib.suppress(BrokenPipeError, BlockingIOError):
            process.stdin.close()  # EOF: the probe server exits
        try:
            await asyncio.to_thread(process.wait, 5)
        except subprocess.TimeoutExpired:
            process.kill()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_GET(self) -> None:
        path, silent_s = self.path.split("?", 1)[0], time.monotonic() - self.server.fed_at
        if path not in ("/health", "/ready"):
            status, payload = 404, {"detail": "This port serves only GET /health and GET /ready."}
        elif silent_s > self.server.stale_s:
            status, payload = 503, {"detail": f"The service's event loop has not reported for {silent_s:.0f} s."}
        else:
            status, payload = (200, {"status": "ok"}) if path == "/health" else self.server.readiness
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(body)

    do_HEAD = do_GET

    def log_message(self, format: str, *args: object) -> None:
        """Probes are not logged (they would drown the log)."""


class _Server(ThreadingHTTPServer):
    """At most MAX_CONNECTIONS probes at once (more are closed unanswered), on a port shared by every worker's."""

    daemon_threads = allow_reuse_address = allow_reuse_port = True  # reuse port: one probe process per worker
    readiness: tuple[int, dict] = (503, {"detail": "Models are still loading."})
    fed_at, stale_s, slots = time.monotonic(), STALE_S, threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: socket.socket, client_address: object) -> None:
        if self.slots.acquire(blocking=False):
            super().process_request(request, client_address)
        else:
            self.shutdown_request(request)

    def process_request_thread(self, request: socket.socket, client_address: object) -> None:
        """The connection in its slot, cut off after CONNECTION_TIMEOUT_S however slowly its bytes come."""
        deadline = threading.Timer(CONNECTION_TIMEOUT_S, cut_off, (request,))
        deadline.start()
        try:
            super().process_request_thread(request, client_address)
        finally:
            deadline.cancel()
            self.slots.release()


def cut_off(connection: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed
        connection.shutdown(socket.SHUT_RDWR)


def main(host: str, port: int, stale_s: float = STALE_S) -> None:
    try:
        server = _Server((host, port), _Handler)
    except OSError as error:
        print(f"cannot listen on {host}:{port}: {error.strerror}", flush=True)
        sys.exit(1)
    server.stale_s = stale_s
    print("listening", flush=True)
    threading.Thread(target=server.serve_forever, args=(0.2,), daemon=True).start()
    for line in sys.stdin:
        try:
            status, payload = json.loads(line)
        except (ValueError, TypeError):  # a line cut by a full pipe: the next one comes 0.1 s later
            continue
        server.readiness, server.fed_at = (int(status), payload), time.monotonic()
    os._exit(0)  # the end of stdin: the service is gone (its serving threads end with the process)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), *(float(value) for value in sys.argv[3:4]))
