"""Connections against a real `python -m app` with short limits: what uvicorn (h11) and the app do themselves.

Keep-alive idle timeout, stalled bodies, the header size cap, the connection cap, HEAD and 100-continue, the
early 413 and the lingering close after it, and pipelined requests that do not pile up. The header deadline is
test_header_deadline.py's; the write deadline is nginx's, in front (tests/deploy/test_nginx_front.py).
"""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.transports.header_deadline import LINGER_MAX_BYTES, LINGER_S
from tests.conftest import COMMITTED
from tests.helpers import Server, running_server
from tests.integration.test_hostile_requests import raw, read_response, status_of

pytestmark = pytest.mark.slow  # each test starts a server, a browser or a training run: seconds (-m "not slow")

# MNEMO_MAX_BODY_BYTES is 1 MiB; 12 MiB is more than the socket buffers of both ends hold, so a server that closed
# without reading the rest would reset the connection under the client's writes
OVER_THE_BODY_LIMIT = 12 << 20
LIMITS = {
    "MNEMO_KEEP_ALIVE_S": "1",
    "MNEMO_BODY_TIMEOUT_S": "1",
    "MNEMO_MAX_HEADER_BYTES": "8192",
}


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running_server(COMMITTED, **LIMITS) as live:
        yield live


def connect(server: Server, timeout: float = 5) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=timeout)


def closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """(did the server close the connection within `seconds`, what it sent before closing)."""
    sock.settimeout(seconds)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except TimeoutError:
        return False, received
    except ConnectionResetError:
        pass
    return True, received


def test_an_idle_keep_alive_connection_is_closed(server):
    with connect(server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status_of(read_response(sock)) == 200
        started = time.monotonic()
        closed, _ = closed_within(sock, 5)
    assert closed and time.monotonic() - started < 3


def test_an_answer_before_100_continue_closes_the_connection(server):
    """A client told 400 (or 429) before its 100 Continue may skip the body and send its next request: kept
    alive, the connection read that request as the body (the GET below was never answered)."""
    with connect(server) as sock:
        sock.sendall(
            b"POST /similarity HTTP/1.1\r\nHost: x\r\nX-Request-ID: a\r\nX-Request-ID: b\r\nExpect: 100-continue\r\n"
            b"Content-Type: application/json\r\nContent-Length: 40\r\n\r\n"
        )
        answer = read_response(sock)
        assert status_of(answer) == 400 and b"connection: close" in answer.lower(), answer
        closed, received = closed_within(sock, 5)
    assert closed and received == b""


def test_a_stalled_body_gets_408(server):
    with connect(server) as sock:
        sock.sendall(b"POST /similarity HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
        sock.sendall(b'Content-Length: 100\r\n\r\n{"sentence_a": ')
        started = time.monotonic()
        answer = read_response(sock)
    assert status_of(answer) == 408 and b"MNEMO_BODY_TIMEOUT_S" in answer
    assert time.monotonic() - started < 3


def test_headers_over_the_cap_get_400_and_a_close(server):
    """h11 measures what it holds unparsed after each read (of up to 256 KB): headers past the cap while still
    incomplete are refused (a 1 MB header here); nginx in front caps each header line at 16 KB."""
    with connect(server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n")
        closed, received = closed_within(sock, 5)
    assert closed and status_of(received) == 400, received[:200]
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_a_request_past_the_connection_cap_gets_the_services_503_and_a_close():
    """MNEMO_MAX_CONNECTIONS (3) open connections are served; a request on one more is answered (not refused) in the
    service's JSON naming the setting (under /v2 in the protocol's shape), with Retry-After and its id, then closed."""
    with running_server(COMMITTED, MNEMO_MAX_CONNECTIONS="3") as live:
        held = [connect(live) for _ in range(2)]
        try:
            with connect(live) as third:
                third.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                assert status_of(read_response(third)) == 200
            held.append(connect(live))
            for path, field in (("/health", "detail"), ("/v2", "error")):
                with connect(live) as extra:
                    extra.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nX-Request-ID: over-{field}\r\n\r\n".encode())
                    closed, received = closed_within(extra, 5)
                head, _, body = received.partition(b"\r\n\r\n")
                assert closed and status_of(received) == 503, received
                assert re.search(rb"(?im)^retry-after: 1\r?$", head), head
                assert re.search(rf"(?im)^x-request-id: over-{field}\r?$".encode(), head), head
                assert "MNEMO_MAX_CONNECTIONS" in json.loads(body)[field], body
            with connect(live) as extra:  # a large request sent at once: its answer read, not reset (lingering close)
                head = f"POST /similarity HTTP/1.1\r\nHost: x\r\nContent-Length: {OVER_THE_BODY_LIMIT}\r\n\r\n"
                extra.sendall(head.encode() + b" " * OVER_THE_BODY_LIMIT)
                closed, received = closed_within(extra, 5)
            assert closed and status_of(received) == 503, received[:300]
        finally:
            for sock in held:
                sock.close()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # the slots free up as soon as the held connections are gone
            if status_of(raw(live, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")) == 200:
                break
            time.sleep(0.1)
        assert httpx.get(f"{live.url}/health").status_code == 200
        assert 'mnemo_server_requests_rejected_total{reason="connections"} 3.0' in httpx.get(f"{live.url}/metrics").text


def test_head_and_expect_100_continue_are_answered_on_a_kept_alive_connection(server):
    """A HEAD answer has no body write (its head is written when the response completes); an interim
    100 Continue goes out at once, before the client sends the body, not held back with the final head."""
    pair = json.dumps({"sentence_a": "A man plays.", "sentence_b": "A man plays music.", "return_attention": False})
    with connect(server) as sock:
        sock.sendall(b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(65536)
        assert head.startswith(b"HTTP/1.1 200") and head.endswith(b"\r\n\r\n"), head
        sock.sendall(
            f"POST /similarity HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(pair)}\r\n"
            "Expect: 100-continue\r\n\r\n".encode()
        )
        assert sock.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(pair.encode())
        answer = read_response(sock)
        assert status_of(answer) == 200 and b'"relatedness"' in answer, answer[:300]


def test_a_content_length_with_trailing_spaces_over_the_limit_gets_the_413_before_100_continue(server):
    """The parser accepts "2000000 " (it keeps the trailing space in the value); isdigit() did not, so the early
    413 was skipped and the client was told to send its 2 MB body."""
    with connect(server) as sock:
        sock.sendall(
            b"POST /similarity HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
            b"Content-Length: 2000000 \r\n\r\n"
        )
        assert status_of(read_response(sock)) == 413


def final_answer_without_100_continue(sock: socket.socket, head: bytes) -> bytes:
    """Send `head` (announcing a 40-byte body and `Expect: 100-continue`) but no body, and read the answer: the final
    one, not a `100 Continue` asking for a body the server will not read (RFC 9110 10.1.1)."""
    sock.sendall(head + b"Expect: 100-continue\r\nContent-Length: 40\r\n\r\n")
    answer = read_response(sock)
    assert not answer.startswith(b"HTTP/1.1 100"), answer
    assert b"connection: close" in answer.lower(), answer  # the body was not read: the connection cannot go on
    return answer


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"POST /no-such-path HTTP/1.1\r\nHost: x\r\n", 404),
        (b"PUT /similarity HTTP/1.1\r\nHost: x\r\n", 405),
        (b"POST /ready HTTP/1.1\r\nHost: x\r\n", 405),
        (b"POST /similarity HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n", 415),
        (b"POST /students/a%20b/interactions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n", 422),
    ],
)
def test_a_request_answered_without_its_body_gets_no_100_continue(server, head, status):
    with connect(server) as sock:
        assert status_of(final_answer_without_100_continue(sock, head)) == status


@pytest.mark.parametrize("head", [b"POST /no-such-path HTTP/1.1\r\n", b"POST /ready HTTP/1.1\r\n"])
def test_a_chunked_body_left_unread_closes_the_connection(server, head):
    """A body with no length that the answer left unread: kept alive, the server would read and throw away whatever
    the client goes on sending, for as long as it sends."""
    with connect(server) as sock:
        sock.sendall(head + b"Host: x\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n")
        answer = read_response(sock)
        assert status_of(answer) in (404, 405) and b"connection: close" in answer.lower(), answer
        sock.settimeout(0.2)
        closed, ends = False, time.monotonic() + 5
        while not closed and time.monotonic() < ends:
            try:
                sock.sendall(b"400\r\n" + b"x" * 1024 + b"\r\n")
                closed = sock.recv(65536) == b""
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                closed = True
    assert closed, "the server went on reading a body it had answered"


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_client_that_sends_its_whole_oversized_body_before_reading_gets_the_413(server, framing):
    """The 413 goes out before the body is read (declared) or once it passes the limit (chunked); the server then
    reads and drops the rest before it closes, instead of closing on it (a reset, and the answer lost)."""
    head = "POST /similarity HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    if framing == "chunked":
        chunk = b" " * (64 << 10)
        request = (head + "Transfer-Encoding: chunked\r\n\r\n").encode()
        request += (b"%x\r\n" % len(chunk) + chunk + b"\r\n") * (OVER_THE_BODY_LIMIT // len(chunk)) + b"0\r\n\r\n"
    else:
        request = (head + f"Content-Length: {OVER_THE_BODY_LIMIT}\r\n\r\n").encode() + b" " * OVER_THE_BODY_LIMIT
    with connect(server) as sock:
        sock.sendall(request)  # a reset would raise here or in the read
        closed, received = closed_within(sock, 5)
    assert closed and status_of(received) == 413, received[:300]
    assert b"connection: close" in received.lower() and b"1048576" in received


def test_urllib_posting_an_oversized_body_reads_the_413(server):
    request = urllib.request.Request(f"{server.url}/knowledge-trace", data=b" " * OVER_THE_BODY_LIMIT)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 413 and "MNEMO_MAX_BODY_BYTES" in refused.value.read().decode()


def test_a_lingering_close_is_bounded_in_time_and_bytes(server):
    head = b"POST /similarity HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n"
    with connect(server) as sock:  # answered 413 at once, then the client sends nothing more and never closes
        sock.sendall(head)
        assert status_of(read_response(sock)) == 413
        started = time.monotonic()
        sock.settimeout(LINGER_S + 3)
        assert sock.recv(65536) == b""  # the FIN after the answer, at once
        with pytest.raises((BrokenPipeError, ConnectionResetError)):  # the server's side closed after LINGER_S
            while time.monotonic() - started < LINGER_S + 3:
                sock.sendall(b" " * 1024)
                time.sleep(0.05)
    assert time.monotonic() - started < LINGER_S + 1
    with connect(server) as sock:  # a client that keeps sending is cut off after LINGER_MAX_BYTES
        sock.sendall(head)
        sent = 0
        with pytest.raises((BrokenPipeError, ConnectionResetError)):
            while sent < 4 * LINGER_MAX_BYTES:
                sock.sendall(b" " * (1 << 20))
                sent += 1 << 20
    assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200


def rss_mb(pid: int) -> float:
    return int(Path(f"/proc/{pid}/status").read_text().split("VmRSS:")[1].split()[0]) / 1024


def worker_pid(server: Server) -> int:
    """The one worker of gunicorn's master (MNEMO_WORKERS=1): the process that reads the connections."""
    (worker,) = Path(f"/proc/{server.process.pid}/task/{server.process.pid}/children").read_text().split()
    return int(worker)


def test_pipelined_requests_sent_faster_than_answered_do_not_pile_up_in_memory(server):
    """2 MB of pipelined GET /health on one connection that reads nothing: h11 parses one request at a time and
    uvicorn stops reading while it is answered, so the rest waits in the socket."""
    worker = worker_pid(server)
    before = rss_mb(worker)
    with connect(server) as sock:
        sock.setblocking(False)
        request, sent, ends = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" * 60_000, 0, time.monotonic() + 3
        while sent < len(request) and time.monotonic() < ends:
            try:
                sent += sock.send(request[sent : sent + 65536])
            except BlockingIOError:
                time.sleep(0.01)
        time.sleep(1)
        grown = rss_mb(worker) - before
    assert grown < 20, f"the server grew by {grown:.0f} MB"
    with connect(server) as sock:  # and pipelining still works: every request answered, in order
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" * 200 + b"GET /ready HTTP/1.1\r\nHost: x\r\n\r\n")
        answers = b""
        while b"ready" not in answers:
            answers += sock.recv(65536)
    assert answers.count(b"HTTP/1.1 200") == 201
