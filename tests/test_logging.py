"""The buffered log writer: records reach stderr in order, from its thread, and all of them when it stops."""

from __future__ import annotations

import logging
import sys
import threading
import time

from app.core import logging as service_logging
from app.core.logging import BufferedWriter, TextFormatter


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.getMessage(), threading.current_thread().name))


def _record(message: str) -> logging.LogRecord:
    return logging.LogRecord("mnemo.test", logging.INFO, __file__, 0, message, None, None)


def test_the_writer_thread_writes_buffered_records_in_order_within_its_interval():
    target = _Collect()
    writer = BufferedWriter(target, interval_s=0.2)
    try:
        for index in range(100):
            writer.handle(_record(f"line {index}"))
        assert len(target.lines) < 100  # logging only buffered them
        deadline = time.monotonic() + 5
        while len(target.lines) < 100 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [message for message, _ in target.lines] == [f"line {index}" for index in range(100)]
        assert {thread for _, thread in target.lines} == {"mnemo-log-writer"}
    finally:
        writer.stop()


def test_stop_and_close_write_out_what_is_buffered():
    target = _Collect()
    writer = BufferedWriter(target, interval_s=60)
    writer.handle(_record("before close"))
    writer.close()  # as logging.config.dictConfig does: the writer keeps working afterwards
    writer.handle(_record("after close"))
    writer.stop()
    assert [message for message, _ in target.lines] == ["before close", "after close"]


def test_a_full_buffer_is_written_out_by_the_thread_that_logs(monkeypatch):
    monkeypatch.setattr(service_logging, "MAX_BUFFERED_RECORDS", 5)
    target = _Collect()
    writer = BufferedWriter(target, interval_s=60)
    try:
        for index in range(5):
            writer.handle(_record(f"line {index}"))
        assert [message for message, _ in target.lines] == [f"line {index}" for index in range(5)]
        assert {thread for _, thread in target.lines} == {threading.current_thread().name}
    finally:
        writer.stop()


def test_the_text_format_escapes_control_characters_in_a_message_so_it_stays_one_line():
    message = "model said: bad\r\n2026-01-01 00:00:00,000 INFO mnemo.access: GET / 200\x1b[2J\x00\u2028\x85 é"
    line = TextFormatter().format(_record(message))
    assert line.endswith(
        " INFO mnemo.test: model said: bad\\r\\n2026-01-01 00:00:00,000 INFO mnemo.access: GET / 200"
        "\\x1b[2J\\x00\\u2028\\x85 é"
    ), line


def test_a_traceback_in_the_text_format_is_indented_so_its_message_cannot_start_a_line():
    try:
        raise ValueError("student abc\n2026-01-01 00:00:00,000 INFO mnemo.access: GET / 200\x1b[2J")
    except ValueError:
        record = logging.LogRecord("mnemo.errors", logging.ERROR, __file__, 0, "bug", None, sys.exc_info())
    first, *rest = TextFormatter().format(record).split("\n")
    assert first.endswith(" ERROR mnemo.errors: bug") and rest[0] == "  Traceback (most recent call last):", rest
    assert all(line.startswith("  ") for line in rest) and "\x1b" not in "".join(rest), rest
    assert rest[-2:] == ["  ValueError: student abc", "  2026-01-01 00:00:00,000 INFO mnemo.access: GET / 200\\x1b[2J"]
