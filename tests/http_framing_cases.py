"""HTTP/1.1 framing cases (RFC 9112) as raw bytes, with what a conforming server must answer.

Shared by tests/integration/test_http_framing.py (a real server on loopback) and benchmarks/servers.py (the candidates).
Each case is a name, the bytes a client sends at once, and a check of the `Exchange`: everything the server
sent back before it closed the connection (or `READ_S` passed).
"""

from __future__ import annotations

import re
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

READ_S = 3.0


@dataclass(frozen=True)
class Exchange:
    host: str
    port: int
    statuses: list[int]  # the status of every response received, in order
    closed: bool  # the server closed the connection within READ_S
    student: str  # the student id the pipelined append used


def exchange(host: str, port: int, request: bytes | Callable[[str], bytes]) -> Exchange:
    """Send `request` (or `request(student_id)`) at once and read until the server closes or READ_S pass."""
    student = f"framing-{uuid.uuid4().hex[:12]}"
    data = request(student) if callable(request) else request
    received, closed = b"", False
    with socket.create_connection((host, port), timeout=READ_S) as sock:
        sock.sendall(data)
        deadline = time.monotonic() + READ_S
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            except ConnectionResetError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            received += chunk
    statuses = [int(status) for status in re.findall(rb"(?m)^HTTP/1\.[01] (\d{3}) ", received)]
    return Exchange(host, port, statuses, closed, student)


def rejected(result: Exchange) -> bool:
    """RFC 9112's answer to a message whose framing cannot be trusted: one 400, then the connection closed."""
    return result.statuses == [400] and result.closed


def rejected_or_closed(result: Exchange) -> bool:
    """A MAY-reject case: a 400 and a close, or one ordinary answer and a close (no second request read)."""
    return len(result.statuses) == 1 and result.statuses[0] < 500 and result.closed


def stored_interactions(host: str, port: int, student: str) -> int:
    """How many interactions the service holds for `student` (0 when it has no state)."""
    request = f"GET /students/{student} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
    with socket.create_connection((host, port), timeout=READ_S) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    match = re.search(rb'"interactions":(\d+)', answer)
    return int(match.group(1)) if answer.startswith(b"HTTP/1.1 200") and match else 0


def pipelined_append_then(malformed: bytes) -> Callable[[str], bytes]:
    """A valid student append, then `malformed`, in one write."""

    def request(student: str) -> bytes:
        body = b'{"interactions": [{"question": 12, "correct": true}]}'
        append = (
            f"POST /students/{student}/interactions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        return append + malformed

    return request


def append_answered_or_not_run(result: Exchange) -> bool:
    """The pipelined append was answered (its 200, then a 400 or just the close), or it did not run (only the 400,
    nothing stored): never stored without its answer."""
    stored = stored_interactions(result.host, result.port, result.student)
    if result.statuses in ([200], [200, 400]):
        return result.closed and stored == 1
    return rejected(result) and stored == 0


def post(headers: str, body: bytes = b"") -> bytes:
    return f"POST /similarity HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{headers}\r\n".encode() + body


PAIR = b'{"sentence_a": "a man plays", "sentence_b": "a woman sings"}'
CHUNKED = b"%x\r\n%s\r\n0\r\n\r\n" % (len(PAIR), PAIR)

Case = tuple[str, bytes | Callable[[str], bytes], Callable[[Exchange], bool]]
CASES: list[Case] = [
    (
        "a valid append pipelined ahead of conflicting Content-Lengths",
        pipelined_append_then(b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"),
        append_answered_or_not_run,
    ),
    (
        "a valid append pipelined ahead of a bad chunk size",
        pipelined_append_then(post("Transfer-Encoding: chunked\r\n", b"zz\r\n" + PAIR + b"\r\n0\r\n\r\n")),
        append_answered_or_not_run,
    ),
    ("two different Content-Lengths", post("Content-Length: 5\r\nContent-Length: 6\r\n", PAIR), rejected),
    ("a Content-Length list of different values", post("Content-Length: 5, 6\r\n", PAIR), rejected),
    ("a signed Content-Length", post(f"Content-Length: +{len(PAIR)}\r\n", PAIR), rejected),
    ("a chunk size that is not hex", post("Transfer-Encoding: chunked\r\n", b"zz\r\n" + PAIR), rejected),
    ("a chunk size past 64 bits", post("Transfer-Encoding: chunked\r\n", b"1" + b"0" * 20 + b"\r\n" + PAIR), rejected),
    ("a chunked coding that is not the last", post("Transfer-Encoding: chunked, gzip\r\n", CHUNKED), rejected),
    ("an unknown transfer coding", post("Transfer-Encoding: zork\r\n", CHUNKED), rejected),
    (
        "Transfer-Encoding beside Content-Length",
        post(f"Content-Length: {len(CHUNKED) + 40}\r\nTransfer-Encoding: chunked\r\n", CHUNKED),
        rejected_or_closed,
    ),
    (
        "whitespace before a header's colon",
        post(f"Content-Length : {len(PAIR)}\r\n", PAIR),
        rejected,
    ),
    ("no Host in HTTP/1.1", b"GET /health HTTP/1.1\r\n\r\n", rejected),
    ("two Host fields", b"GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", rejected),
    ("a bare CR inside a header", b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\rb\r\n\r\n", rejected),
    (
        "an obs-fold continuation line",
        b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\nConnection: close\r\n\r\n",
        rejected_or_closed,
    ),
    ("a space before the first header", b"GET /health HTTP/1.1\r\n Host: x\r\n\r\n", rejected),
    (
        "a bare LF ending the request line",
        b"GET /health HTTP/1.1\nHost: x\r\nConnection: close\r\n\r\n",
        rejected_or_closed,
    ),
    ("a request line with no version", b"GET /health\r\nHost: x\r\n\r\n", rejected),
    ("an HTTP version that does not exist", b"GET /health HTTP/1.7x\r\nHost: x\r\n\r\n", rejected),
    ("a NUL in a header value", b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\0b\r\n\r\n", rejected),
]
