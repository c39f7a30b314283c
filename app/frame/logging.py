"""Logging for the service: plain text or one JSON object per line."""

from __future__ import annotations

import atexit
import collections
import json
import logging
import re
import threading
import time

WRITE_INTERVAL_S = 0.05  # a buffered log record reaches stderr within this time
MAX_BUFFERED_RECORDS = 10_000  # past this, the thread that logs writes the buffer out itself (bounded memory)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, with any `extra` fields given to the logger."""

    EXTRA_FIELDS = ("request_id", "method", "path", "status", "duration_ms", "client")

    def format(self, record: logging.LogRecord) -> str:
        payload = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        payload.update({key: getattr(record, key) for key in self.EXTRA_FIELDS if hasattr(record, key)})
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        return json.dumps(payload)


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


class BufferedWriter(logging.Handler):
    """Keeps records in a buffer that a writer thread formats and writes out every `interval_s` (and at exit).

    A request that logs only appends its record: no formatting, no write(), and no thread wake-up, which
    cost the request about 45 us after its answer was sent (on a 2-core machine, where a kept-alive client's
    next request waited for them). The thread writes while the event loop waits or ONNX Runtime runs (both
    release the GIL). A record reaches stderr at most `interval_s` after it was logged. Should the thread fall
    behind (a flood of refused requests, each with its access line), the thread that logs the
    `MAX_BUFFERED_RECORDS`-th buffered record writes them out itself, as an unbuffered handler would.
    """

    def __init__(self, target: logging.Handler, interval_s: float = WRITE_INTERVAL_S) -> None:
        super().__init__()
        self.target = target
        self._records: collections.deque[logging.LogRecord] = collections.deque()
        self._writing = threading.Lock()  # one writer at a time keeps the lines in order
        self._interval_s = interval_s
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._write_until_stopped, name="mnemo-log-writer", daemon=True)
        self._thread.start()

    def emit(self, record: logging.LogRecord) -> None:
        self._records.append(record)
        if len(self._records) >= MAX_BUFFERED_RECORDS:
            self.write_out()

    def write_out(self) -> None:
        """Format and write every buffered record, oldest first."""
        with self._writing:
            while self._records:
                self.target.handle(self._records.popleft())

    def close(self) -> None:
        """Write out what is buffered. The thread goes on: `logging.config.dictConfig` (uvicorn's log config)
        closes every handler and keeps using them; at exit `logging.shutdown` closes them last."""
        self.write_out()
        super().close()

    def stop(self) -> None:
        """End the thread and write out what is buffered (when the handler is replaced)."""
        self._stopping.set()
        self._thread.join()
        self.write_out()

    def _write_until_stopped(self) -> None:
        while not self._stopping.wait(self._interval_s):
            self.write_out()


_writer: BufferedWriter | None = None


def write_out_logs() -> None:
    """Write out the buffered records now (when the app stops serving; at exit this happens by itself)."""
    if _writer is not None:
        _writer.write_out()


def _stop_writer() -> None:
    if _writer is not None:
        _writer.stop()


def configure_logging(level: str, fmt: str) -> None:
    """Configure the `mnemo` loggers once (later calls replace the handler).

    Records go through a `BufferedWriter` to stderr. uvicorn's own access log is switched off: the app
    writes exactly one access line per request (`mnemo.access`, app/middleware.py), however it is started
    (`python -m app` or `uvicorn app.main:app`).
    """
    _skip_unused_record_fields()
    stream = logging.StreamHandler()
    stream.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    global _writer
    if _writer is not None:
        _writer.stop()
    else:  # runs before logging's own exit handler, which would write while the thread may hold a record
        atexit.register(_stop_writer)
    _writer = BufferedWriter(stream)
    logger = logging.getLogger("mnemo")
    logger.handlers[:] = [_writer]
    logger.setLevel(level.upper())
    logger.propagate = False
    logging.getLogger("uvicorn.access").disabled = True
    for name, throttle in _throttles.items():
        logging.getLogger(name).addFilter(throttle)  # once: addFilter skips a filter already there


def _skip_unused_record_fields() -> None:
    """Do not collect what neither format prints: the caller's file and line (a stack walk), the thread and
    the process (the logging HOWTO's "Optimization" switches). An access line then costs 25 us, not 65."""
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
