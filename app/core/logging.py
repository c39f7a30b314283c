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
    """TEXT_FORMAT, one line per record: control characters in the message (a client's path, say) are written
    as escapes such as `\\r\\n` or `\\x1b`, so no client can forge a line or colour the operator's terminal.
    A traceback follows on lines of its own, each indented (its exception's message may hold client text): only
    a record's first line starts at the margin, which is also how log shippers tell where a record ends."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = UNPRINTABLE.sub(_escaped, record.message)
        return super().formatMessage(record)

    def formatException(self, ei: tuple) -> str:  # ei: sys.exc_info()
        text = UNPRINTABLE_BUT_NEWLINE.sub(_escaped, super().formatException(ei))
        return "\n".join(f"  {line}" for line in text.split("\n"))


class EverySecondAtMost(logging.Filter):
    """Lets through at most one record per `interval_s` for each of `messages` (templates, as logged); those held
    back meanwhile are counted, and the count is logged (`... (N more since the last line)`) once the interval
    is over, by a timer, so that the last burst is reported too. For warnings any client can cause once per
    request without reaching the app (so without an access line): a flood of them would otherwise fill the log
    at its own rate, whatever level the operator keeps."""

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


# Per-request warnings of requests refused before the app (uvicorn's parser).
CLIENT_CAUSED_WARNINGS = {
    "uvicorn.error": frozenset(
        {
            "Invalid HTTP request received.",
            # any request with an Upgrade header (h2c, websocket: the service serves neither)
            "Unsupported upgrade request.",
            "No supported WebSocket library detected. Please use \"pip install 'uvicorn[standard]'\", or install "
            "'websockets' or 'wsproto' manually.",
        }
    ),
}
_throttles = {name: EverySecondAtMost(messages) for name, messages in CLIENT_CAUSED_WARNINGS.items()}


WRITE_INTERVAL_S = 0.05  # a queued record reaches stderr within this time
MAX_QUEUED_RECORDS = 10_000  # a queue this long wakes the writer at once (bounded memory in a flood of lines)


class RecordQueue(QueueHandler):
    """Puts each record on the queue as it is, for the writer thread of this process to format and write; a
    full queue (`MAX_QUEUED_RECORDS`) wakes the writer at once. (The base class formats the record first and
    drops its traceback, as a queue to another process needs.)"""

    def __init__(self, records: queue.SimpleQueue, full: threading.Event) -> None:
        super().__init__(records)
        self.full = full

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record

    def enqueue(self, record: logging.LogRecord) -> None:
        self.queue.put_nowait(record)
        if self.queue.qsize() >= MAX_QUEUED_RECORDS:
            self.full.set()


class IntervalListener(QueueListener):
    """A `QueueListener` that writes what is queued every `interval_s`, or at once when `wake` is set (a full
    queue, `stop`), instead of being woken for each record: a request that logs then costs no thread switch."""

    def __init__(self, records: queue.SimpleQueue, target: logging.Handler, wake: threading.Event) -> None:
        super().__init__(records, target)
        self.wake = wake

    def dequeue(self, block: bool) -> logging.LogRecord:
        while True:
            try:
                return self.queue.get_nowait()
            except queue.Empty:
                self.wake.wait(WRITE_INTERVAL_S)
                self.wake.clear()

    def enqueue_sentinel(self) -> None:
        super().enqueue_sentinel()
        self.wake.set()


_records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
_wake = threading.Event()
_queue_handler = RecordQueue(_records, _wake)
_listener: QueueListener | None = None
_listener_lock = threading.Lock()


def _listen(target: logging.Handler) -> None:
    """Write the queued records to `target` from now on (after those already queued, to the previous one)."""
    global _listener
    with _listener_lock:
        if _listener is None:
            atexit.register(_stop_listening)  # runs before logging's own exit handler flushes the handlers
        else:
            _listener.stop()
        _listener = IntervalListener(_records, target, _wake)
        _listener.start()


def _stop_listening() -> None:
    global _listener
    with _listener_lock:
        if _listener is not None:
            _listener.stop()  # writes out every record queued before it
            _listener = None


def write_out_logs() -> None:
    """Write out the queued records now (when the app stops serving, or before a worker reports ready)."""
    with _listener_lock:
        if _listener is not None:
            _listener.stop()
            _listener.start()


def _stream(formatter: logging.Formatter) -> logging.StreamHandler:
    stream = logging.StreamHandler()
    stream.setFormatter(formatter)
    return stream


def configure_logging(level: str, fmt: str) -> None:
    """Configure the `mnemo` loggers (a later call replaces the format and level).

    Records go through a queue to stderr. uvicorn's own access log is switched off: the app writes exactly one
    access line per request (`mnemo.access`, app/transports/middleware.py), however it is started.
    The thread, process and multiprocessing fields, which neither format prints, are not collected (the logging
    HOWTO's "Optimization" switches).
    """
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    _listen(_stream(JsonFormatter() if fmt == "json" else TextFormatter()))
    logger = logging.getLogger("mnemo")
    logger.handlers[:] = [_queue_handler]
    logger.setLevel(level.upper())
    logger.propagate = False
    logging.getLogger("uvicorn.access").disabled = True
    for name, throttle in _throttles.items():
        logging.getLogger(name).addFilter(throttle)  # once: addFilter skips a filter already there


def log_fields(logger: logging.Logger, level: int, message: str, args: tuple, fields: Mapping[str, Any]) -> None:
    """Log `message % args` with `fields` as its extra fields, without looking up the caller's file and line
    (a walk up the stack that neither format prints), for a line logged on every request."""
    if logger.isEnabledFor(level):
        logger.handle(logger.makeRecord(logger.name, level, "", 0, message, args, None, extra=fields))
