"""How late the event loop runs: sampled continuously, so deadlines can be met with the answer already sent; each sample
is also the loop's heartbeat (the probe process takes a loop that stops sampling for stuck)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from prometheus_client import Gauge

SAMPLE_EVERY_S = 0.1
DECAY = 0.93  # per sample: a lag spike counts half after about one second


class LoopLag:
    """`recent_s`: the largest recent delay of a timer past its due time, decaying once the loop keeps up."""

    def __init__(self, gauge: Gauge) -> None:
        self.recent_s = 0.0
        self.on_sample: Callable[[], None] = lambda: None  # called after each sample (the heartbeat)
        self._gauge = gauge

    async def sample(self) -> None:
        """Sample until cancelled (a task for the app's life)."""
        while True:
            due = time.perf_counter() + SAMPLE_EVERY_S
            await asyncio.sleep(SAMPLE_EVERY_S)
            self.recent_s = max(time.perf_counter() - due, self.recent_s * DECAY)
            self._gauge.set(self.recent_s)
            self.on_sample()
