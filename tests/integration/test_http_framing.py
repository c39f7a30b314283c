"""HTTP/1.1 framing (RFC 9112) on a real `python -m app`: the raw bytes of tests/http_framing_cases.py over a socket.

A message whose framing cannot be trusted gets 400 and a close; a valid request pipelined ahead of it is answered
before the close, or not run at all, never stored without its answer.
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator

import pytest

from tests.conftest import COMMITTED
from tests.helpers import Server, running_server
from tests.http_framing_cases import CASES, PAIR, exchange, post, rejected
from tests.integration.test_hostile_requests import raw, read_response


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running_server(COMMITTED) as live:
        yield live


@pytest.mark.parametrize(("name", "request_bytes", "check"), CASES, ids=[case[0] for case in CASES])
def test_framing_that_cannot_be_trusted_is_refused_as_rfc_9112_says(server, name, request_bytes, check):
    host, port = server.url.removeprefix("http://").split(":")
    result = exchange(host, int(port), request_bytes)
    assert check(result), f"{name}: statuses {result.statuses}, closed {result.closed}"


REFUSED = [(name, request) for name, request, check in CASES if check is rejected]


@pytest.mark.parametrize(("name", "request_bytes"), REFUSED, ids=[name for name, _ in REFUSED])
def test_a_refused_message_is_answered_in_the_services_json_shape_with_a_request_id(server, name, request_bytes):
    """Whichever layer refuses it (h11's parser or the request edge), the 400 is `{"detail": ...}` with an id."""
    head, _, body = raw(server, request_bytes).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), head
    assert re.search(rb"(?im)^content-type: application/json\r?$", head), head
    assert re.search(rb"(?im)^x-request-id: [0-9a-f]{32}\r?$", head), head
    assert isinstance(json.loads(body)["detail"], str)


def test_a_body_refused_by_the_parser_keeps_the_requests_own_id(server):
    request = post("Transfer-Encoding: chunked\r\nX-Request-ID: trace-42\r\n", b"zz\r\n" + PAIR)
    head = raw(server, request).partition(b"\r\n\r\n")[0]
    assert head.startswith(b"HTTP/1.1 400 ") and re.search(rb"(?im)^x-request-id: trace-42\r?$", head), head


def test_a_route_that_answers_without_reading_the_refused_body_logs_no_error(server):
    """The parser's 400 went first: the route's own answer (a 404 before the body is read) is not an app error."""
    for path in ("/nope", "/v2/models/nope/infer"):
        request = (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nX-Request-ID: late-1\r\n\r\nzz\r\n\r\n"
        )
        assert raw(server, request.encode()).startswith(b"HTTP/1.1 400 ")
    time.sleep(1)  # the route's answer comes after the 400
    assert not [line for line in server.output if '"error"' in line or "without completing" in line]


@pytest.mark.parametrize("pause_s", [0, 0.5], ids=["before-the-route-runs", "while-the-route-reads-it"])
def test_a_v2_body_refused_by_the_parser_is_the_protocols_400_and_logged_as_400_under_its_id(server, pause_s):
    """Under /v2 the parser's 400 is `{"error": ...}`; the access line of the request records that 400, under the id
    the answer carried, whether the route had not started yet or was reading the body when the bad chunk came."""
    host, port = server.url.removeprefix("http://").split(":")
    request = b"POST /v2/models/dkvmn-assist2009/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        if pause_s:
            sock.sendall(request)  # the route starts and awaits the body
            time.sleep(pause_s)
            request = b""
        sock.sendall(request + b"zz\r\n\r\n")
        head, _, body = read_response(sock).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ") and json.loads(body)["error"].startswith("Malformed HTTP request"), body
    rid = re.search(rb"(?im)^x-request-id: ([0-9a-f]{32})\r?$", head)[1].decode()
    deadline, logged = time.monotonic() + 10, []
    while not logged and time.monotonic() < deadline:  # written once the route's own (dropped) answer is done
        logged = [line for line in server.output if '"mnemo.access"' in line and rid in line]
        time.sleep(0.1)
    assert [json.loads(line)["status"] for line in logged] == [400], logged
