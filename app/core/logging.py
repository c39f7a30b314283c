"""Logging: text or one JSON object per line (python-json-logger) on the standard library's QueueHandler, so that a
request that logs only queues its record; and what the log may say about a request and its bugs."""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import traceback
from collections.abc import Iterable
from logging.handlers import QueueHandler, QueueListener
from typing import Any
from urllib.parse import quote

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter as LibraryJsonFormatter
from starlette.types import Scope

from app.core.errors import printable

MAX_TRACKED_ERRORS = 1024
MAX_UNMATCHED_PATH = 64
# Unmatched paths under these one-segment prefixes may still carry an id (/students/<id>/typo): cut after the prefix.
ID_BEARING_PREFIXES = ("/students/",)
# uvicorn's warnings for requests refused before the app (bad framing; an Upgrade header: h2c, websocket)
CLIENT_CAUSED_WARNINGS = (
    "Invalid HTTP request received.",
    "Unsupported upgrade request.",
    "No supported WebSocket library detected. Please use \"pip install 'uvicorn[standard]'\", or install "
    "'websockets' or 'wsproto' manually.",
)


class JsonFormatter(LibraryJsonFormatter):
    """time (UTC, ISO 8601), level, logger, message, the logger's `extra` fields, and the traceback as `exception`."""

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


class TextFormatter(logging.Formatter):
    """Control characters escaped and a traceback indented: no client text can forge a line or colour the terminal."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = printable(record.message, None)
        return super().formatMessage(record)

    def formatException(self, ei: tuple) -> str:  # ei: sys.exc_info()
        return "\n".join(f"  {printable(line, None)}" for line in super().formatException(ei).split("\n"))


class EverySecondAtMost(logging.Filter):
    """At most one record a second of each of `messages` (warnings any client can cause once per request); a timer
    logs how many were held back when their second is over."""

    def __init__(self, messages: Iterable[str]) -> None:
        super().__init__()
        self.messages = frozenset(messages)
        self._last: dict[str, float] = {}
        self._held_back: dict[str, tuple[int, logging.LogRecord]] = {}  # count, and the latest record held back
        self._lock = threading.Lock()  # the report runs on the timer's thread

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg not in self.messages:
            return True
        with self._lock:
            since_last = time.monotonic() - self._last.get(record.msg, float("-inf"))
            if since_last >= 1:
                self._last[record.msg] = time.monotonic()
                return True
            count, _ = self._held_back.get(record.msg, (0, record))
            self._held_back[record.msg] = (count + 1, record)
        if count == 0:  # the first held back in this second: report them all when it ends
            threading.Timer(1 - since_last, self._report, [record.msg]).start()
        return False

    def _report(self, message: str) -> None:
        with self._lock:
            count, record = self._held_back.pop(message)
            self._last[message] = time.monotonic()
        report = logging.makeLogRecord({**vars(record), "msg": f"{message} ({count} more since the last line)"})
        logging.getLogger(record.name).handle(report)  # passes this filter: its message is not one of `messages`


class RecordQueue(QueueHandler):
    """The standard QueueHandler, its QueueListener writing on a thread of its own: a request that logs only queues
    the record, as it is (the standard `prepare` renders message and traceback into one string where it is logged)."""

    def __init__(self) -> None:
        super().__init__(queue.SimpleQueue())
        self.listener, self.listening = QueueListener(self.queue), False  # write_to gives it its target
        os.register_at_fork(after_in_child=self.forked)

    def forked(self) -> None:
        """In a forked child (gunicorn --preload): a queue of its own, which the next record starts a listener on."""
        self.queue = queue.SimpleQueue()  # the parent writes what it had queued
        self.listener, self.listening = QueueListener(self.queue, *self.listener.handlers), False

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record

    def enqueue(self, record: logging.LogRecord) -> None:
        """Queue `record` (under `lock`, as logging emits), the listener started again if a write-out stopped it."""
        if not self.listening:
            self.listener.start()
            self.listening = True
        super().enqueue(record)

    def write_to(self, target: logging.Handler) -> None:
        """Write out what is queued, then write to `target` (from the next record on)."""
        with self.lock:
            self.flush()
            self.listener = QueueListener(self.queue, target)

    def flush(self) -> None:
        """Write out what is queued (the listener does as it stops; also logging's at exit, starting no thread)."""
        with self.lock:
            if self.listening:
                self.listener.stop()
                self.listening = False


_client_caused_warnings = EverySecondAtMost(CLIENT_CAUSED_WARNINGS)
_queue = RecordQueue()
write_out_logs = _queue.flush  # when the app stops serving


def configure_logging(level: str, fmt: str) -> None:
    """Configure the `mnemo` loggers (again on a later call). uvicorn's access log is off: the app writes its own."""
    stderr = logging.StreamHandler()
    stderr.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    _queue.write_to(stderr)
    logger = logging.getLogger("mnemo")
    logger.handlers[:] = [_queue]
    logger.setLevel(level.upper())
    logger.propagate = False
    logging.getLogger("uvicorn.access").disabled = True
    logging.getLogger("uvicorn.error").addFilter(_client_caused_warnings)  # once: addFilter skips one already there


def route_path(scope: Scope) -> str:
    """The path below the app's `root_path` (a proxy's prefix, `--root-path`), as the routes match it."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root) :] or "/" if root and (path + "/").startswith(root + "/") else path


def loggable_path(scope: Scope, path: str | None = None) -> str:
    """The matched route's template (`/students/{student_id}`), never client text such as an id; else the path
    percent-encoded (one field of the access line), truncated, and cut after any prefix followed by an id."""
    if template := getattr(scope.get("route"), "path", None):
        return template
    path = route_path(scope) if path is None else path  # the edge passes the one it took
    if path.startswith(ID_BEARING_PREFIXES):
        return path[: path.index("/", 1) + 1] + "…"  # the prefix
    path = quote(path, safe="/:@!$&'()*+,;=")  # RFC 3986's characters of a path stay as they are
    return path if len(path) <= MAX_UNMATCHED_PATH else path[:MAX_UNMATCHED_PATH] + "…"


class TracebackBudget:
    """Logs an error's traceback at most once per distinct error (type, innermost file and line) per window, so that
    a client repeating a request that hits a bug cannot flood the log."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._last_logged: dict[tuple[str, str], tuple[float, int]] = {}  # key -> (logged at, repeats since)

    def admit(self, error: BaseException) -> tuple[bool, int]:
        """(log the traceback now?, how many times it was seen since its traceback was last logged)."""
        frames = traceback.extract_tb(error.__traceback__)
        key = type(error).__qualname__, f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"
        logged_at, repeats = self._last_logged.get(key, (float("-inf"), 0))
        if (now := time.monotonic()) - logged_at < self.window_s:
            self._last_logged[key] = (logged_at, repeats + 1)
            return False, repeats + 1
        if len(self._last_logged) >= MAX_TRACKED_ERRORS:
            self._last_logged.clear()
        self._last_logged[key] = (now, 0)
        return True, repeats
