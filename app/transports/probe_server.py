"""`python -m app.transports.probe_server HOST PORT [STALE_S]`: /health and /ready in a process of their own.

Standard library only: it answers from the `[status, body]` lines the service writes to its stdin; none for STALE_S
(the service's loop stuck) is 503, and the end of stdin (the service gone) ends it."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socket import SO_REUSEPORT, SOL_SOCKET

STALE_S = 30.0  # no readiness line for this long: the service's event loop is stuck, not merely busy
MAX_CONNECTIONS = 16  # probe connections served at once; more are closed unanswered
SOCKET_TIMEOUT_S = 5.0


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = SOCKET_TIMEOUT_S
    server: _Server

    def do_GET(self) -> None:
        self._answer(with_body=True)

    def do_HEAD(self) -> None:
        self._answer(with_body=False)

    def _answer(self, with_body: bool) -> None:
        status, payload = self.server.answer(self.path.split("?", 1)[0])
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Probes are not logged (they would drown the log)."""


class _Server(ThreadingHTTPServer):
    """At most MAX_CONNECTIONS probes at once (more are closed unanswered), on a port shared by every worker's."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], stale_s: float) -> None:
        self.stale_s, self.fed_at = stale_s, time.monotonic()
        self.readiness: tuple[int, dict] = (503, {"detail": "Models are still loading."})
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(address, _Handler)

    def answer(self, path: str) -> tuple[int, dict]:
        silent_s = time.monotonic() - self.fed_at
        if path not in ("/health", "/ready"):
            return 404, {"detail": "This port serves only GET /health and GET /ready."}
        if silent_s > self.stale_s:
            return 503, {"detail": f"The service's event loop has not reported for {silent_s:.0f} s."}
        return (200, {"status": "ok"}) if path == "/health" else self.readiness

    def server_bind(self) -> None:
        self.socket.setsockopt(SOL_SOCKET, SO_REUSEPORT, 1)  # one probe process per worker, one port
        super().server_bind()

    def process_request(self, request, client_address) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


def main(host: str, port: int, stale_s: float = STALE_S) -> None:
    try:
        server = _Server((host, port), stale_s)
    except OSError as error:
        print(f"cannot listen on {host}:{port}: {error.strerror}", flush=True)
        sys.exit(1)
    print("listening", flush=True)
    threading.Thread(target=server.serve_forever, args=(0.2,), daemon=True).start()
    for line in sys.stdin:
        try:
            status, payload = json.loads(line)
        except (ValueError, TypeError):  # a line cut by a full pipe: the next one comes 0.1 s later
            continue
        server.readiness, server.fed_at = (int(status), payload), time.monotonic()
    server.shutdown()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), *(float(value) for value in sys.argv[3:4]))
