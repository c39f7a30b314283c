"""/health and /ready on a port of their own (MNEMO_PROBE_PORT), answered by a thread, not the event loop.

Under overload the event loop handles every open connection's request in turn, so with a thousand busy
connections a request on the main port waits one or more turns of the loop: hundreds of milliseconds
(BENCHMARKS.md). This listener has its own socket and threads, and holds the GIL for well under a
millisecond per probe, so liveness and readiness answer in milliseconds however busy the service is.
The same two routes stay on the main port too. Probes are not access-logged. With several workers each
binds the port with SO_REUSEPORT, so a probe reaches one of them.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from app.frame.responses import dumps

logger = logging.getLogger("mnemo.probes")
MAX_PROBE_CONNECTIONS = 16  # connections served at once; more are closed unanswered
PROBE_SOCKET_TIMEOUT_S = 5.0  # a client that stalls loses its connection
Readiness = Callable[[], tuple[int, dict]]


class _ProbeHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = PROBE_SOCKET_TIMEOUT_S
    server: _ProbeHttpServer

    def do_GET(self) -> None:
        self._answer(with_body=True)

    def do_HEAD(self) -> None:
        self._answer(with_body=False)

    def _answer(self, with_body: bool) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/health":
            status, payload = 200, {"status": "ok"}
        elif path == "/ready":
            status, payload = self.server.readiness()
        else:
            status, payload = 404, {"detail": "This port serves only GET /health and GET /ready."}
        body = dumps(payload)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Probes are not logged (a probe every few seconds would drown the access log)."""


class _ProbeHttpServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], readiness: Readiness) -> None:
        self.readiness = readiness
        self.slots = threading.BoundedSemaphore(MAX_PROBE_CONNECTIONS)
        super().__init__(address, _ProbeHandler)

    def server_bind(self) -> None:
        if hasattr(socket, "SO_REUSEPORT"):
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()

    def process_request(self, request: socket.socket, client_address: tuple) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: socket.socket, client_address: tuple) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class ProbeListener:
    """Serves /health and /ready on `host:port` from a background thread until `stop()`."""

    def __init__(self, host: str, port: int, readiness: Readiness) -> None:
        self._server = _ProbeHttpServer((host, port), readiness)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.2,), name="probes", daemon=True)

    def start(self) -> None:
        self._thread.start()
        host, port = self._server.server_address[:2]
        logger.info("probes: /health and /ready also on http://%s:%d", host, port)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
