"""A clock that a test advances by hand, and an event loop whose timers run on it.

The batcher takes its clock (`ModelBatcher(clock=...)`) and waits for a fuller batch with an event-loop timer;
run on `run_on_clock`, both read the same manual clock, so a test says how much time passes (or a toy run's
cost says it) instead of sleeping, and its outcome does not depend on the machine's speed.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
WATCHDOG_S = 30.0  # real seconds: a test waiting on a timer its clock never reaches fails instead of hanging


class ManualClock:
    """Seconds that pass only when `advance` is called (by a test, or by a toy run on a worker thread)."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


class ManualClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose time is a ManualClock: a timer due in 0.3 s fires once the clock has been advanced
    by 0.3 s, however long that takes in real time."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__()
        self._manual_clock = clock

    def time(self) -> float:
        return self._manual_clock()


def run_on_clock(clock: ManualClock, coroutine: Coroutine[Any, Any, T]) -> T:
    """Run `coroutine` on a ManualClockLoop of `clock`; it fails after WATCHDOG_S real seconds, the sign of a
    timer the test never advanced the clock to."""

    async def guarded() -> T:
        task, loop, expired = asyncio.current_task(), asyncio.get_running_loop(), threading.Event()

        def expire() -> None:
            expired.set()
            loop.call_soon_threadsafe(task.cancel)

        watchdog = threading.Timer(WATCHDOG_S, expire)
        watchdog.start()
        try:
            return await coroutine
        except asyncio.CancelledError:
            if not expired.is_set():
                raise
            raise TimeoutError(f"still waiting after {WATCHDOG_S} real seconds: a timer never reached") from None
        finally:
            watchdog.cancel()

    with asyncio.Runner(loop_factory=lambda: ManualClockLoop(clock)) as runner:
        return runner.run(guarded())
