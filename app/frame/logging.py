"""Logging for the service: plain text or one JSON object per line."""

from __future__ import annotations

import json
import logging
import time


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


def uvicorn_log_config(level: str, fmt: str) -> dict:
    """uvicorn's `log_config`: its own loggers (startup, shutdown, protocol warnings) in the service's format."""
    formatter = {"()": JsonFormatter} if fmt == "json" else {"format": TEXT_FORMAT}
    handler = {"class": "logging.StreamHandler", "formatter": "mnemo", "stream": "ext://sys.stderr"}
    quiet = {"handlers": [], "propagate": False}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"mnemo": formatter},
        "handlers": {"mnemo": handler},
        "loggers": {
            "uvicorn": {"handlers": ["mnemo"], "level": level.upper(), "propagate": False},
            "uvicorn.error": {"level": level.upper()},
            "uvicorn.access": quiet,  # the app writes one access line per request itself
        },
    }


def configure_logging(level: str, fmt: str) -> None:
    """Configure the `mnemo` loggers once (later calls replace the handler).

    uvicorn's own access log is switched off: the app writes exactly one access line per request
    (`mnemo.access`, app/middleware.py), however it is started (`python -m app` or `uvicorn app.main:app`).
    """
    _skip_unused_record_fields()
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    logger = logging.getLogger("mnemo")
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False
    logging.getLogger("uvicorn.access").disabled = True


def _skip_unused_record_fields() -> None:
    """Do not collect what neither format prints: the caller's file and line (a stack walk), the thread and
    the process (the logging HOWTO's "Optimization" switches). An access line then costs 25 us, not 65."""
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
