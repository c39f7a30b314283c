"""benchmarks/behaviours.py's pure parts: the verdict rule, the table, and its HTTP client against a loopback server."""

from __future__ import annotations

import asyncio
import math

import pytest

from benchmarks.behaviours import (
    FAILURES,
    METRICS,
    TIME,
    Rule,
    get_request,
    hammer,
    read_answer,
    table,
    verdict,
)


@pytest.mark.parametrize(
    ("base", "new", "rule", "expected"),
    [
        (10.0, 12.0, TIME, "same"),  # 2 ms: within the 5 ms floor
        (10.0, 16.0, TIME, "worse"),  # 6 ms: past max(25% of 10, 5 ms)
        (100.0, 120.0, TIME, "same"),  # 20 ms: within 25% of 100
        (100.0, 130.0, TIME, "worse"),
        (100.0, 70.0, TIME, "better"),
        (0, 1, FAILURES, "worse"),  # counts of failures: any rise is worse
        (3, 0, FAILURES, "better"),
        (2, 2, FAILURES, "same"),
        (17, 20, Rule("higher"), "better"),
        (200, 0, Rule("higher"), "worse"),
        (100.0, 80.0, Rule("higher", relative=0.25), "same"),
        (100.0, 70.0, Rule("higher", relative=0.25), "worse"),
        (None, 1.0, TIME, "n/a"),
        (1.0, math.nan, TIME, "n/a"),
    ],
)
def test_the_verdict_allows_the_larger_of_the_relative_and_absolute_slack(base, new, rule, expected):
    assert verdict(base, new, rule) == expected


def test_a_rule_says_itself_in_words():
    assert TIME.text() == "lower is better; same within max(25%, 5 ms)"
    assert FAILURES.text() == "lower is better; any change counts"
    assert Rule("higher", absolute=0.02).text() == "higher is better; same within 0.02"


def test_the_table_has_a_row_per_metric_and_says_n_a_for_a_missing_figure():
    first, second = METRICS[0], METRICS[1]
    figures = {"base": {first.key: 0.5, second.key: 0}, "new": {first.key: 1.0, second.key: 2}}
    rows = table(figures)
    assert len(rows) == 2 + len(METRICS)
    assert rows[2].split(" | ")[2:5] == ["0.500", "1.000", "better"]
    assert rows[3].split(" | ")[2:5] == ["0", "2", "worse"]
    assert rows[4].split(" | ")[2:5] == ["–", "–", "n/a"]


def reader_of(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


def test_an_answer_is_read_whole_by_its_length_or_its_chunks():
    async def read() -> list:
        reader = reader_of(
            b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 5\r\nRetry-After: 1\r\n\r\nbusy!"
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
            b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
        )
        answers = [await read_answer(reader) for _ in range(3)]
        return [*answers, reader.at_eof()]

    assert asyncio.run(read()) == [(429, True), (200, True), (503, False), True]


def test_a_truncated_answer_is_an_error():
    async def read() -> None:
        await read_answer(reader_of(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"))

    with pytest.raises(asyncio.IncompleteReadError):
        asyncio.run(read())


async def serve_then_hammer(answer: bytes, connections: int, seconds: float):
    """A loopback server that reads one request head and writes `answer` per request; hammer's result on it."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(answer)
                await writer.drain()
                if b"close" in answer:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        return await hammer(port, [get_request("/health")], connections, seconds)


def test_hammer_counts_every_answer_by_status_within_its_time():
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    outcomes, elapsed = asyncio.run(serve_then_hammer(ok, connections=3, seconds=0.3))
    assert len(outcomes) > 3
    assert {status for status, _ in outcomes} == {200}
    assert 0.3 <= elapsed < 3


def test_hammer_names_the_error_of_a_request_that_got_no_answer():
    nothing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 100\r\n\r\ntoo short"
    outcomes, _ = asyncio.run(serve_then_hammer(nothing, connections=1, seconds=0.2))
    assert outcomes and {status for status, _ in outcomes} == {"IncompleteReadError"}
