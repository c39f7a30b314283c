"""The event-loop lag gauge, on a real event loop blocked for a while (it measures real time)."""

from __future__ import annotations

import asyncio
import time

from app.core.loop_lag import LoopLag
from app.core.metrics import Metrics


def test_the_loop_lag_sees_a_blocked_event_loop_and_decays_once_it_keeps_up():
    metrics = Metrics()

    async def scenario():
        lag = LoopLag(metrics.loop_lag)
        sampling = asyncio.create_task(lag.sample())
        await asyncio.sleep(0.15)
        time.sleep(0.3)  # the event loop is blocked: its timers run late
        await asyncio.sleep(0.15)
        blocked = lag.recent_s
        await asyncio.sleep(1.5)
        sampling.cancel()
        return blocked, lag.recent_s

    blocked, later = asyncio.run(scenario())
    assert blocked >= 0.2
    assert later < blocked / 2  # a spike counts half after about a second
    assert metrics.registry.get_sample_value("mnemo_event_loop_lag_seconds") == later
