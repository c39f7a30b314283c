"""The last resort for bugs: one log line per error, and its traceback at most once per distinct error (type and
innermost file and line) per window, so that a client repeating a request that hits a bug cannot flood the log.
"""

from __future__ import annotations

import logging
import time
import traceback

from starlette.types import Scope

from app.core.errors import printable
from app.core.paths import loggable_path

logger = logging.getLogger("mnemo.errors")
INTERNAL_ERROR = {"detail": "Internal error; it has been logged."}
MAX_TRACKED_ERRORS = 1024


class TracebackBudget:
    """Decides whether an error's traceback is logged: once per distinct error per window."""

    def __init__(self, window_s: float, clock=time.monotonic) -> None:
        self.window_s = window_s
        self.clock = clock
        self._last_logged: dict[tuple[str, str], tuple[float, int]] = {}  # key -> (logged at, repeats since)

    def admit(self, error: BaseException) -> tuple[bool, int]:
        """(log the traceback now?, how many times it was seen since its traceback was last logged)."""
        key = _signature(error)
        now = self.clock()
        logged_at, repeats = self._last_logged.get(key, (None, 0))
        if logged_at is not None and now - logged_at < self.window_s:
            self._last_logged[key] = (logged_at, repeats + 1)
            return False, repeats + 1
        if len(self._last_logged) >= MAX_TRACKED_ERRORS:
            self._last_logged.clear()
        self._last_logged[key] = (now, 0)
        return True, repeats


def _signature(error: BaseException) -> tuple[str, str]:
    frames = traceback.extract_tb(error.__traceback__)
    place = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"
    return type(error).__qualname__, place


def log_unexpected(budget: TracebackBudget, scope: Scope, error: Exception) -> None:
    """One line for an exception no handler took, with its traceback when `budget` admits it."""
    with_traceback, repeats = budget.admit(error)
    logger.error(
        "unexpected error on %s %s: %s: %s%s",
        scope["method"],
        loggable_path(scope),  # the route template: no student id or other client text in the log
        type(error).__name__,
        printable(" ".join(str(error).split())),  # one line
        f" (seen {repeats} more time(s) since its last traceback)" if with_traceback and repeats else "",
        exc_info=error if with_traceback else None,
    )
