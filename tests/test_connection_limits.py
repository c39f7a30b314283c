"""Connections a client cannot hold or fill, against a real `python -m app` with short limits.

Header deadline (idle and slowloris connections), keep-alive idle timeout, stalled bodies, the header
size cap, the connection cap (503, never a refused accept), the write deadline for a client that
never reads its 8 MB answer, the lingering close after an answer sent while the body still arrives, and the
count of the requests answered before the app (400, 431, 408).
"""

from __future__ import annotations

import json
import re
import select
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.transports.connection_guard import LINGER_MAX_BYTES, LINGER_S, peer_gone
from tests.conftest import COMMITTED
from tests.helpers import Server, running_server
from tests.test_hostile_requests import read_response, status_of

pytestmark = pytest.mark.slow  # each test starts a server, a browser or a training run: seconds (-m "not slow")

LIMITS = {
    "MNEMO_HEADER_TIMEOUT_S": "1",
    "MNEMO_KEEP_ALIVE_S": "1",
    "MNEMO_BODY_TIMEOUT_S": "1",
    "MNEMO_WRITE_TIMEOUT_S": "2",
    "MNEMO_MAX_HEADER_BYTES": "8192",
    "MNEMO_MAX_CONNECTIONS": "40",
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


def test_an_idle_connection_gets_408_and_is_closed_after_the_header_timeout(server):
    with connect(server) as sock:
        started = time.monotonic()
        closed, received = closed_within(sock, 5)
    assert closed and status_of(received) == 408
    assert 0.8 < time.monotonic() - started < 3
    head, body = received.split(b"\r\n\r\n", 1)  # the service's error shape, with a request id, like any answer
    assert b"content-type: application/json" in head.lower() and b"x-request-id: " in head.lower()
    assert json.loads(body) == {"detail": "Request headers not received in time (MNEMO_HEADER_TIMEOUT_S)."}


def test_slowloris_headers_do_not_extend_the_deadline(server):
    with connect(server) as sock:
        started = time.monotonic()
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        try:
            for _ in range(20):  # one header byte every 0.2 s: 4 s if it were allowed
                sock.sendall(b"X")
                time.sleep(0.2)
        except (BrokenPipeError, ConnectionResetError):
            pass
        closed, received = closed_within(sock, 5)
    assert closed and time.monotonic() - started < 3
    assert received == b"" or status_of(received) == 408


def test_an_idle_keep_alive_connection_is_closed(server):
    with connect(server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status_of(read_response(sock)) == 200
        started = time.monotonic()
        closed, _ = closed_within(sock, 5)
    assert closed and time.monotonic() - started < 3


def test_a_connection_idle_after_the_body_of_an_early_answer_is_closed(server):
    """A 400 (or 429) answered before the body was read keeps the connection; the body that arrives after the
    answer cancelled uvicorn's keep-alive timer, and nothing armed it again: the idle connection stayed open."""
    with connect(server) as sock:
        sock.sendall(
            b"POST /similarity HTTP/1.1\r\nHost: x\r\nX-Request-ID: a\r\nX-Request-ID: b\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        )
        assert status_of(read_response(sock)) == 400
        sock.sendall(b" " * 100)  # the body, skipped
        started = time.monotonic()
        closed, received = closed_within(sock, 5)
    assert closed and received == b"" and time.monotonic() - started < 3


def test_a_stalled_body_gets_408(server):
    with connect(server) as sock:
        sock.sendall(b"POST /similarity HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
        sock.sendall(b'Content-Length: 100\r\n\r\n{"sentence_a": ')
        started = time.monotonic()
        answer = read_response(sock)
    assert status_of(answer) == 408 and b"MNEMO_BODY_TIMEOUT_S" in answer
    assert time.monotonic() - started < 3


def test_headers_over_the_cap_get_431(server):
    with connect(server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n")
        assert status_of(read_response(sock)) == 431
    with connect(server) as sock:  # sent whole before reading: the 431 arrives, not a reset (lingering close)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (12 << 20) + b"\r\n\r\n")
        closed, received = closed_within(sock, 5)
    assert closed and status_of(received) == 431, received[:200]
    assert httpx.get(f"{server.url}/health").status_code == 200


def counter(server: Server, series: str) -> float:
    """The value of one series of /metrics, e.g. 'mnemo_http_bad_requests_total{reason="malformed"}'."""
    lines = httpx.get(f"{server.url}/metrics").text.splitlines()
    return next(float(line.split()[-1]) for line in lines if line.startswith(series + " "))


def refusals(server: Server) -> float:
    """mnemo_server_requests_rejected_total{reason="connections"}: the connections answered 503 so far."""
    return counter(server, 'mnemo_server_requests_rejected_total{reason="connections"}')


BAD_REQUESTS = {  # reason: (status, what the client sends)
    "malformed": (400, b"GET /health HTTP/1.1\r\nHost x\r\n\r\n"),
    "headers_too_large": (431, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n"),
    "header_timeout": (408, b"GET /health HTTP/1.1\r\nHost: x\r\n"),  # never ends its headers
}


@pytest.mark.parametrize("reason", BAD_REQUESTS)
def test_requests_answered_before_the_app_are_counted_by_reason(server, reason):
    series = {name: f'mnemo_http_bad_requests_total{{reason="{name}"}}' for name in BAD_REQUESTS}
    before = {name: counter(server, line) for name, line in series.items()}
    status, request = BAD_REQUESTS[reason]
    with connect(server) as sock:
        sock.sendall(request)
        closed, received = closed_within(sock, 5)
    assert closed and status_of(received) == status
    after = {name: counter(server, line) for name, line in series.items()}
    assert after == {**before, reason: before[reason] + 1}


def test_connections_over_the_cap_are_answered_503_not_refused(server):
    refused_before = refusals(server)
    idle = [connect(server) for _ in range(40)]
    try:
        time.sleep(0.2)
        with connect(server) as extra:
            closed, received = closed_within(extra, 2)
        assert closed and status_of(received) == 503 and b"retry-after: 1" in received.lower()
    finally:
        for sock in idle:
            sock.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the slots free up as soon as the idle clients are gone
        try:
            if httpx.get(f"{server.url}/health", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert refusals(server) == refused_before + 1


def test_a_client_that_never_reads_its_answer_is_disconnected(server):
    history = [{"question": 1 + index % 100, "correct": index % 3 == 0} for index in range(10_000)]
    body = json.dumps({"model": "dkvmn-assist2009", "interactions": history, "return_attention": True}).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    host, port = server.url.removeprefix("http://").split(":")
    sock.connect((host, int(port)))
    with sock:
        head = "POST /knowledge-trace HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        select.select([sock], [], [], 120)  # the answer is computed (however long that takes here) and written...
        time.sleep(4)  # ...until the buffers fill; then 2 s (MNEMO_WRITE_TIMEOUT_S) pass without reading
        received, closed = b"", False
        sock.settimeout(5)
        try:
            while chunk := sock.recv(1 << 20):
                received += chunk
            closed = True
        except ConnectionResetError:
            closed = True
        except TimeoutError:
            pass  # still open: the server kept the connection (and the answer) for a client that did not read
    head, _, body = received.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?im)^content-length:\s*(\d+)", head).group(1))
    assert head.startswith(b"HTTP/1.1 200") and length > 4_000_000
    assert closed and len(body) < length, (closed, len(body), length)  # the rest was dropped, not kept for us
    assert httpx.get(f"{server.url}/health").status_code == 200


@pytest.mark.skipif(not hasattr(socket, "TCP_INFO"), reason="TCP_INFO is Linux's")
@pytest.mark.parametrize("how", ["close", "half-close", "reset"])
def test_a_departed_peer_is_seen_in_the_kernel_before_the_socket_is_read(how):
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        accepted, _ = listener.accept()
        with accepted:
            client.sendall(b"POST / HTTP/1.1\r\n")  # unread data, as for a request the loop has not reached
            assert not peer_gone(accepted)
            if how == "half-close":
                client.shutdown(socket.SHUT_WR)
            if how == "reset":
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            if how != "half-close":
                client.close()
            deadline = time.monotonic() + 5
            while not peer_gone(accepted) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert peer_gone(accepted)
        client.close()


TCPI_DATA_SEGS_IN = 152  # struct tcp_info (linux/tcp.h): the u32 count of segments received that carried data


def data_segments_received(sock: socket.socket) -> int:
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return struct.unpack_from("I", info, TCPI_DATA_SEGS_IN)[0]


@pytest.mark.skipif(not hasattr(socket, "TCP_INFO"), reason="TCP_INFO is Linux's")
def test_a_small_answer_arrives_as_one_segment_head_and_body_together(server):
    pair = json.dumps({"sentence_a": "A man plays.", "sentence_b": "A man plays music.", "return_attention": False})
    requests = [
        b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
        f"POST /similarity HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(pair)}\r\n"
        f"\r\n{pair}".encode(),
        b"GET /models/nothing-here HTTP/1.1\r\nHost: x\r\n\r\n",
    ]
    with connect(server) as sock:
        for request in requests:
            before = data_segments_received(sock)
            sock.sendall(request)
            answer = read_response(sock)
            assert answer.split(b"\r\n\r\n", 1)[1], answer  # a body came
            assert data_segments_received(sock) - before == 1, answer[:200]


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
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")  # no body: discarded by the lingering close
        closed, received = closed_within(sock, 5)
    assert closed and received == b""


def test_a_content_length_with_trailing_spaces_over_the_limit_gets_the_413_before_100_continue(server):
    """The parser accepts "2000000 " (it keeps the trailing space in the value); isdigit() did not, so the early
    413 was skipped and the client was told to send its 2 MB body."""
    with connect(server) as sock:
        sock.sendall(
            b"POST /similarity HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
            b"Content-Length: 2000000 \r\n\r\n"
        )
        assert status_of(read_response(sock)) == 413


# the server's MNEMO_MAX_BODY_BYTES is 1 MiB; 12 MiB is more than the socket buffers of both ends hold, so a
# server that closed without reading the rest would reset the connection under the client's writes
OVER_THE_BODY_LIMIT = 12 << 20


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_client_that_sends_its_whole_oversized_body_before_reading_gets_the_413(server, framing):
    """The 413 goes out before the body is read (declared) or once it passes the limit (chunked); the server then
    reads and drops the rest instead of closing on it, which would reset the connection under the client's
    writes and lose the answer."""
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


def test_a_lingering_close_is_bounded_in_time_and_bytes(server):
    head = b"POST /similarity HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n"
    with connect(server) as sock:  # answered 413 at once, then the client sends nothing more and never closes
        sock.sendall(head)
        started = time.monotonic()
        closed, received = closed_within(sock, LINGER_S + 3)
    assert closed and status_of(received) == 413 and time.monotonic() - started < LINGER_S + 1
    with connect(server) as sock:  # a client that keeps sending is cut off after LINGER_MAX_BYTES
        sock.sendall(head)
        sent = 0
        with pytest.raises((BrokenPipeError, ConnectionResetError)):
            while sent < 4 * LINGER_MAX_BYTES:
                sock.sendall(b" " * (1 << 20))
                sent += 1 << 20
    assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200


def test_a_connection_over_the_cap_that_sends_a_large_request_at_once_reads_the_503(server):
    """The 503 goes out as the connection is accepted; the request is read and dropped (a short lingering
    close), so the client's writes complete and it reads the answer."""
    idle = [connect(server) for _ in range(40)]
    head = f"POST /similarity HTTP/1.1\r\nHost: x\r\nContent-Length: {OVER_THE_BODY_LIMIT}\r\n\r\n".encode()
    try:
        time.sleep(0.2)
        for _ in range(3):
            with connect(server) as extra:
                extra.sendall(head + b" " * OVER_THE_BODY_LIMIT)
                closed, received = closed_within(extra, 3)
            assert closed and status_of(received) == 503, received[:200]
    finally:
        for sock in idle:
            sock.close()


def rss_mb(pid: int) -> float:
    return int(Path(f"/proc/{pid}/status").read_text().split("VmRSS:")[1].split()[0]) / 1024


def test_pipelined_requests_sent_faster_than_answered_do_not_pile_up_in_memory(server):
    """2 MB of pipelined GET /health on one connection that reads nothing: uvicorn parsed them all into its queue
    (113 MB); the guard parses at most PIPELINE_MAX ahead and leaves the rest unread."""
    before = rss_mb(server.process.pid)
    with connect(server) as sock:
        sock.setblocking(False)
        request, sent, ends = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" * 60_000, 0, time.monotonic() + 3
        while sent < len(request) and time.monotonic() < ends:
            try:
                sent += sock.send(request[sent : sent + 65536])
            except BlockingIOError:
                time.sleep(0.01)
        time.sleep(1)
        grown = rss_mb(server.process.pid) - before
    assert grown < 20, f"the server grew by {grown:.0f} MB"
    with connect(server) as sock:  # and pipelining still works: every request answered, in order
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" * 200 + b"GET /ready HTTP/1.1\r\nHost: x\r\n\r\n")
        answers = b""
        while b"ready" not in answers:
            answers += sock.recv(65536)
    assert answers.count(b"HTTP/1.1 200") == 201
