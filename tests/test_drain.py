"""Graceful drain of a real `python -m app` on the committed models: SIGTERM with 32 requests in flight."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import httpx

from tests.conftest import COMMITTED
from tests.helpers import running_server

IN_FLIGHT = 32


def _history(length: int) -> dict:
    interactions = [{"question": i % 110 + 1, "correct": i % 3 != 0} for i in range(length)]
    return {"model": "dkvmn-assist2009", "interactions": interactions, "next_questions": [1], "return_attention": False}


def _in_flight(url: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    return next(
        float(line.split()[-1]) for line in text.splitlines() if line.startswith("mnemo_http_requests_in_flight")
    )


def test_sigterm_answers_every_admitted_request_refuses_new_ones_and_exits_cleanly():
    async def scenario(server):
        limits = httpx.Limits(max_connections=IN_FLIGHT + 8)
        async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as client:
            admitted = [
                asyncio.create_task(client.post("/knowledge-trace", json=_history(1000))) for _ in range(IN_FLIGHT)
            ]
            deadline = time.monotonic() + 20
            while _in_flight(server.url) < IN_FLIGHT + 1 and time.monotonic() < deadline:  # +1: the /metrics call
                await asyncio.sleep(0.02)
            server.process.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)
            async with httpx.AsyncClient(base_url=server.url, timeout=10) as newcomer:
                late = await newcomer.post("/knowledge-trace", json=_history(5))
                ready = await newcomer.get("/ready")
            return await asyncio.gather(*admitted), late, ready

    with running_server(COMMITTED, MNEMO_DRAIN_S="120", MNEMO_REQUEST_TIMEOUT_S="120") as server:
        answers, late, ready = asyncio.run(scenario(server))
        assert [answer.status_code for answer in answers] == [200] * IN_FLIGHT
        assert all(len(answer.json()["predictions"]) == 1000 for answer in answers)
        assert late.status_code == 503 and late.headers["retry-after"] == "1" and late.headers["connection"] == "close"
        assert ready.status_code == 503
        assert server.process.wait(timeout=60) == 0
    logged = [json.loads(line) for line in server.output if line.startswith("{")]
    assert any("SIGTERM: draining" in line["message"] for line in logged)
    assert any(line["message"] == "drained: no request in flight" for line in logged)
