"""deploy/nginx/nginx.conf for real: Debian's nginx in front of a real `python -m app`, on loopback.

What no in-process Python server does, nginx does here: a deadline for request headers (slowloris), idle
connections closed, a cap on connections per client; and the framing cases reach the service only as clean
requests. The test shortens the file's timeouts and cap so that it runs in seconds; everything else is the file.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import COMMITTED
from tests.helpers import ROOT, HeldRequest, free_port, running_server
from tests.http_framing_cases import CASES, Exchange, exchange

CONFIG = ROOT / "deploy" / "nginx" / "nginx.conf"
HEADER_TIMEOUT_S = 2
CONNECTIONS_PER_CLIENT = 4


def front_config(app_port: int, port: int, prefix: Path) -> str:
    """deploy/nginx/nginx.conf with the test's ports, its files under `prefix`, shorter timeouts and a smaller cap."""
    text = CONFIG.read_text()
    replacements = {
        r"server 127\.0\.0\.1:8000;": f"server 127.0.0.1:{app_port};",
        r"listen 8080 reuseport;": f"listen 127.0.0.1:{port};",
        r"/tmp/": f"{prefix}/",
        r"client_header_timeout \d+s;": f"client_header_timeout {HEADER_TIMEOUT_S}s;",
        r"keepalive_timeout \d+s;": f"keepalive_timeout {HEADER_TIMEOUT_S}s;",
        r"limit_conn per_client \d+;": f"limit_conn per_client {CONNECTIONS_PER_CLIENT};",
    }
    for pattern, value in replacements.items():
        text, count = re.subn(pattern, value, text)
        assert count >= 1, f"{pattern} is no longer in {CONFIG}"
    return text


@pytest.fixture(scope="module")
def front(tmp_path_factory) -> Iterator[tuple[str, int]]:
    """(host, port) of nginx in front of `python -m app`."""
    nginx = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")
    if nginx is None:
        pytest.fail("nginx is not installed: `make system-deps` installs Debian's")
    prefix = tmp_path_factory.mktemp("nginx")
    port = free_port()
    with running_server(COMMITTED) as server:
        app_port = int(server.url.rsplit(":", 1)[1])
        (prefix / "nginx.conf").write_text(front_config(app_port, port, prefix))
        process = subprocess.Popen(
            [nginx, "-p", str(prefix), "-c", str(prefix / "nginx.conf"), "-g", "daemon off;"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    assert process.poll() is None, process.communicate()[0]
                    assert time.monotonic() < deadline, "nginx never listened"
                    time.sleep(0.05)
            yield "127.0.0.1", port
        finally:
            process.terminate()
            process.wait(timeout=10)


def closed_within(sock: socket.socket, seconds: float, trickle: bytes | None = None) -> tuple[bool, bytes]:
    """Read until the server closes (True) or `seconds` pass (False), sending `trickle` every 0.5 s meanwhile."""
    received, deadline = b"", time.monotonic() + seconds
    sock.settimeout(0.5)
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            if trickle:
                try:
                    sock.sendall(trickle)
                except OSError:
                    return True, received
            continue
        except ConnectionResetError:
            return True, received
        if not chunk:
            return True, received
        received += chunk
    return False, received


def test_requests_pass_through_to_the_service(front):
    host, port = front
    body = {"sentence_a": "a man plays", "sentence_b": "a woman sings"}
    answer = httpx.post(f"http://{host}:{port}/similarity", json=body, headers={"X-Request-ID": "via-nginx"})
    assert answer.status_code == 200 and 0 <= answer.json()["similarity"] <= 5
    assert answer.headers["x-request-id"] == "via-nginx"


def test_headers_trickled_slowly_get_408_at_the_header_deadline(front):
    started = time.monotonic()
    with socket.create_connection(front) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        closed, received = closed_within(sock, HEADER_TIMEOUT_S + 5, trickle=b"X-A: b\r\n")
    assert closed and not received  # nginx closes at client_header_timeout without an answer (it logs a 408)
    assert HEADER_TIMEOUT_S - 0.5 <= time.monotonic() - started <= HEADER_TIMEOUT_S + 3


def test_an_idle_connection_is_closed(front):
    with socket.create_connection(front) as sock:
        closed, received = closed_within(sock, HEADER_TIMEOUT_S + 5)
    assert closed and not received.startswith(b"HTTP/1.1 2")


def test_connections_over_the_cap_of_one_client_get_503_and_the_others_their_answers(front):
    host, port = front
    body = b'{"sentence_a": "a man plays", "sentence_b": "a woman sings"}'
    held = [HeldRequest(f"http://{host}:{port}", "/similarity", body) for _ in range(CONNECTIONS_PER_CLIENT)]
    time.sleep(0.5)  # nginx has read their headers: each counts against the cap
    over = httpx.post(f"http://{host}:{port}/similarity", content=body, headers={"Content-Type": "application/json"})
    assert over.status_code == 503
    assert [request.finish()[0] for request in held] == [200] * CONNECTIONS_PER_CLIENT


# Where nginx answers otherwise than the service, still refusing the message: what it does instead.
NGINX_ANSWERS = {
    "a chunked coding that is not the last": "501 and a close (RFC 9112 says 400)",
    "an unknown transfer coding": "501 and a close (RFC 9110's Not Implemented)",
    "Transfer-Encoding beside Content-Length": "400, and the connection stays open: nginx reads the rest as requests",
    "a request line with no version": "read as HTTP/0.9: an answer with no status line, then a close",
}


def refused(result: Exchange) -> bool:
    """Nothing was answered 2xx: the message was refused, in nginx's way."""
    return not any(200 <= status < 300 for status in result.statuses) and (result.closed or result.statuses != [])


@pytest.mark.parametrize(("name", "request_bytes", "check"), CASES, ids=[case[0] for case in CASES])
def test_framing_cases_are_refused_in_front(front, name, request_bytes, check):
    result = exchange(*front, request_bytes)
    ok = refused(result) if name in NGINX_ANSWERS else check(result)
    assert ok, f"{name}: statuses {result.statuses}, closed {result.closed}"
