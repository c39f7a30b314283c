"""Logging for the service: plain text or one JSON object per line (python-json-logger), written to stderr by a
thread of the standard library's `QueueListener`, so that a request that logs only puts its record on a queue."""

from __future__ import annotations

import atexit
import logging
import queue
import re
import threading
import time
from collections.abc import Mapping
from logging.handlers import QueueHandler, QueueListener
from typing import Any

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter as LibraryJsonFormatter


class JsonFormatter(LibraryJsonFormatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, any `extra` fields given to the
    logger, and the traceback as `exception`."""

    converter = time.gmtime
    default_time_format = "%Y-%m-%dT%H:%M:%S"
    default_msec_format = "%s.%03dZ"

    def __init__(self) -> None:
        super().__init__(
            ["asctime", "levelname", "name", "message"],
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger", "exc_info": "exception"},
            reserved_attrs=[*RESERVED_ATTRS, "color_message", "taskName"],  # uvicorn's coloured copy of the message
        )

    def process_log_record(self, log_data: dict[str, Any]) -> dict[str, Any]:
        log_data["level"] = log_data["level"].lower()
        return log_data


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# What could end a text line early or rewrite the terminal: C0 and C1 controls (CR, LF, ESC, NUL...), DEL, and
# the Unicode line and paragraph separators.
UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
UNPRINTABLE_BUT_NEWLINE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def _escaped(match: re.Match) -> str:
    return match.group().encode("unicode_escape").decode("ascii")


class TextFormatter(logging.Formatter):
    """TEXT_FORMAT with control characters escaped (`\\r\\n`, `\\x1b`) and a traceback indented, so that no client
    text can forge a line or colour the terminal: only a record's first line starts at the margin."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = UNPRINTABLE.sub(_escaped, record.message)
        return super().formatMessage(record)

    def formatException(self, ei: tuple) -> str:  # ei: sys.exc_info()
        text = UNPRINTABLE_BUT_NEWLINE.sub(_escaped, super().formatException(ei))
        return "\n".join(f"  {line}" for line in text.split("\n"))


class EverySecondAtMost(logging.Filter):
    """At most one record per `interval_s` for each of `messages` (templates); those held back are counted and
    the count logged by a timer when the interval ends. For warnings any client can cause once per request."""

    def __init__(self, messages: frozenset[str], interval_s: float = 1.0) -> None:
        super().__init__()
        self.messages = messages
        self.interval_s = interval_s
        self._lock = threading.Lock()  # records come from the event loop, reports from timer threads
        self._last: dict[str, float] = {}
        self._held_back: dict[str, tuple[int, logging.LogRecord]] = {}  # count, and the latest record held back

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg not in self.messages:
            return True
        with self._lock:
            since_last = time.monotonic() - self._last.get(record.msg, float("-inf"))
            if since_last >= self.interval_s:
                self._last[record.msg] = time.monotonic()
                return True
            count, _ = self._held_back.get(record.msg, (0, record))
            self._held_back[record.msg] = (count + 1, record)
        if count == 0:  # the first held back in this interval: report them all when it ends
            timer = threading.Timer(self.interval_s - since_last, self._report, (record.msg,))
            timer.daemon = True
            timer.start()
        return False

    def _report(self, message: str) -> None:
        with self._lock:
            count, record = self._held_back.pop(message)
            self._last[message] = time.monotonic()
        report = logging.makeLogRecord({**vars(record), "msg": f"{message} ({count} more since the last line)"})
        logging.getLogger(record.name).handle(report)  # passes this filter: its message is not one of `messages`


# uvicorn's warnings for requests refused before the app (bad framing; an Upgrade header: h2c, websocket)
_client_caused_warnings = EverySecondAtMost(
    frozenset(
        {
            "Invalid HTTP request received.",
            "Unsupported upgrade request.",
            "No supported WebSocket library detected. Please use \"pip install 'uvicorn[standard]'\", or install "
            "'websockets' or 'wsproto' manually.",
        }
    )
)


WRITE_INTERVAL_S = 0.05  # a queued record reaches stderr within this time
MAX_QUEUED_RECORDS = 10_000  # a queue this long wakes the writer at once (bounded memory in a flood of lines)
_records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
_wake = threading.Event()  # set: write out now (a full queue, a stop)


class RecordQueue(QueueHandler):
    """Queues each record as it is (unformatted: the writer thread formats it) and wakes the writer when full."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record

    def enqueue(self, record: logging.LogRecord) -> None:
        self.queue.put_nowait(record)
        if self.queue.qsize() >= MAX_QUEUED_RECORDS:
            _wake.set()


class IntervalListener(QueueListener):
    """Writes what is queued every WRITE_INTERVAL_S, or at once when woken (a full queue, `stop`), instead of being
    woken for each record: a request that logs then costs no thread switch."""

    def dequeue(self, block: bool) -> logging.LogRecord:
        while True:
            try:
                return self.queue.get_nowait()
            except queue.Empty:
                _wake.wait(WRITE_INTERVAL_S)
                _wake.clear()

    def enqueue_sentinel(self) -> None:
        super().enqueue_sentinel()
        _wake.set()


_queue_handler = RecordQueue(_records)
_listener: QueueListener | None = None
_listener_lock = threading.Lock()


def _listen(target: logging.Handler | None) -> None:
    """Write out what is queued, then write to `target` from now on (None: stop writing)."""
    global _listener
    with _listener_lock:
        if _listener is not None:
            _listener.stop()  # writes out every record queued before it
        _listener = None if target is None else IntervalListener(_records, target)
        if _listener is not None:
            _listener.start()


atexit.register(_listen, None)  # registered after logging's own exit handler, so it runs before it


def write_out_logs() -> None:
    """Write out the queued records now (when the app stops serving, or before a worker reports ready)."""
    with _listener_lock:
        if _listener is not None:
            _listener.stop()
            _listener.start()


def configure_logging(level: str, fmt: str) -> None:
    """Configure the `mnemo` loggers (a later call replaces the format and level). uvicorn's access log is off: the
    app writes one access line per request; the fields neither format prints are not collected."""
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    stderr = logging.StreamHandler()
    stderr.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    _listen(stderr)
    logger = logging.getLogger("mnemo")
    logger.handlers[:] = [_queue_handler]
    logger.setLevel(level.upper())
    logger.propagate = False
    logging.getLogger("uvicorn.access").disabled = True
    logging.getLogger("uvicorn.error").addFilter(_client_caused_warnings)  # once: addFilter skips one already there


def log_fields(logger: logging.Logger, level: int, message: str, args: tuple, fields: Mapping[str, Any]) -> None:
    """Log `message % args` with `fields` as extra fields, without the walk up the stack for the caller's file and
    line that neither format prints (for the line logged on every request)."""
    if logger.isEnabledFor(level):
        logger.handle(logger.makeRecord(logger.name, level, "", 0, message, args, None, extra=fields))
