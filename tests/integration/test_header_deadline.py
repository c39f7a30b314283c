"""The header deadline (MNEMO_HEADER_TIMEOUT_S, app/transports/header_deadline.py) against a real `python -m app`:
connections that send nothing, or trickle their headers, are closed; slow but timely requests are answered. And its
`HeadWithBody`: an answer's head and body arrive together."""

from __future__ import annotations

import json
import re
import socket
import struct
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import COMMITTED
from tests.helpers import Server, running_server
from tests.integration.test_connection_limits import closed_within, connect
from tests.integration.test_hostile_requests import read_response, status_of

pytestmark = pytest.mark.slow  # starts a server

HEADER_TIMEOUT_S = 1.0
REQUEST = b"GET /health HTTP/1.1\r\nHost: x\r\nUser-Agent: slow\r\n\r\n"
TCPI_DATA_SEGS_IN = 152  # the offset of tcpi_data_segs_in in Linux's struct tcp_info: segments received with data


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running_server(COMMITTED, MNEMO_HEADER_TIMEOUT_S=str(HEADER_TIMEOUT_S), MNEMO_KEEP_ALIVE_S="5") as live:
        yield live


def trickle(sock: socket.socket, data: bytes, every_s: float) -> tuple[bool, bytes]:
    """Send `data` a byte every `every_s`: (did the server close the connection before the last byte, its answer)."""
    sock.settimeout(every_s)
    received = b""
    for index in range(len(data)):
        try:
            sock.sendall(data[index : index + 1])
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            return True, received
        if not chunk:
            return True, received
        received += chunk
    return False, received


def test_a_connection_that_sends_nothing_is_closed_at_the_deadline(server):
    with connect(server) as sock:
        started = time.monotonic()
        closed, received = closed_within(sock, 4 * HEADER_TIMEOUT_S)
    assert closed and received == b""
    assert time.monotonic() - started < 3 * HEADER_TIMEOUT_S


def test_headers_trickled_slower_than_the_deadline_are_cut_off(server):
    with connect(server) as sock:
        started = time.monotonic()
        closed, received = trickle(sock, REQUEST, every_s=0.25)  # 52 bytes: 13 s if let through
    assert closed and received == b""
    assert time.monotonic() - started < 3 * HEADER_TIMEOUT_S


def test_slow_headers_within_the_deadline_are_answered(server):
    with connect(server) as sock:
        for part in (REQUEST[:10], REQUEST[10:30], REQUEST[30:]):
            sock.sendall(part)
            time.sleep(HEADER_TIMEOUT_S / 4)
        assert status_of(read_response(sock)) == 200


def test_a_kept_alive_connection_whose_next_request_trickles_is_closed(server):
    with connect(server) as sock:
        sock.sendall(REQUEST)
        assert status_of(read_response(sock)) == 200
        time.sleep(2 * HEADER_TIMEOUT_S)  # idle between requests is the keep-alive's (5 s), not the deadline's
        sock.sendall(REQUEST)
        assert status_of(read_response(sock)) == 200
        started = time.monotonic()
        closed, received = trickle(sock, REQUEST, every_s=0.25)
    assert closed and received == b""
    assert time.monotonic() - started < 3 * HEADER_TIMEOUT_S


def test_others_are_served_while_held_connections_are_closed_and_counted(server):
    before = header_timeouts(server)
    held = [connect(server) for _ in range(20)]
    try:
        for sock in held[::2]:
            sock.sendall(REQUEST[:20])  # half send a partial request line, half nothing
        assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200
        time.sleep(2 * HEADER_TIMEOUT_S)
        assert all(closed_within(sock, 1)[0] for sock in held)
    finally:
        for sock in held:
            sock.close()
    assert header_timeouts(server) - before >= len(held)


def header_timeouts(server: Server) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=5).text
    found = re.search(r"(?m)^mnemo_header_timeouts_total (\S+)$", text)
    assert found, "mnemo_header_timeouts_total is not exported"
    return float(found.group(1))


def test_the_unread_rest_of_a_body_trickled_after_the_answer_is_cut_off(server):
    """A body the route does not read (GET /health) is owed after the answer: trickled, it held the connection for
    ever (each byte stopped uvicorn's keep-alive timer); it has the header deadline to come in."""
    with connect(server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nx")
        assert status_of(read_response(sock)) == 200
        started = time.monotonic()
        closed, _ = trickle(sock, b"y" * 40, every_s=0.25)  # 10 s if let through
    assert closed and time.monotonic() - started < 3 * HEADER_TIMEOUT_S


def data_segments_in(sock: socket.socket) -> int:
    return struct.unpack_from("I", sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256), TCPI_DATA_SEGS_IN)[0]


def test_an_answer_comes_in_one_segment_its_head_with_its_body(server):
    """uvicorn writes a response's head and its body apart; HeadWithBody makes them one write, so one segment."""
    pair = json.dumps({"sentence_a": "A man is playing a guitar.", "sentence_b": "A man plays the guitar."})
    requests = {  # each with the status it gets
        REQUEST.decode(): 200,
        "GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n": 404,
        f"POST /similarity HTTP/1.1\r\nHost: x\r\nContent-Length: {len(pair)}\r\n\r\n{pair}": 200,
        "POST /similarity HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}": 422,
    }
    with connect(server) as sock:
        for request, status in requests.items():
            before = data_segments_in(sock)
            sock.sendall(request.encode())
            assert status_of(read_response(sock)) == status
            assert data_segments_in(sock) - before == 1, request
        before = data_segments_in(sock)
        sock.sendall(b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n")  # a head without a body: written alone
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            head += sock.recv(65536)
        assert status_of(head) == 200 and data_segments_in(sock) - before == 1
