"""HTTP/1.1 framing (RFC 9112) on a real `python -m app`: the raw bytes of tests/http_framing_cases.py over a socket.

A message whose framing cannot be trusted gets 400 and a close; a valid request pipelined ahead of it is answered
before the close, or not run at all, never stored without its answer.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import COMMITTED
from tests.helpers import Server, running_server
from tests.http_framing_cases import CASES, exchange


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running_server(COMMITTED) as live:
        yield live


@pytest.mark.parametrize(("name", "request_bytes", "check"), CASES, ids=[case[0] for case in CASES])
def test_framing_that_cannot_be_trusted_is_refused_as_rfc_9112_says(server, name, request_bytes, check):
    host, port = server.url.removeprefix("http://").split(":")
    result = exchange(host, int(port), request_bytes)
    assert check(result), f"{name}: statuses {result.statuses}, closed {result.closed}"
