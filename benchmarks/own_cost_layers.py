"""The service's own cost at concurrency 1, layer by layer, in one process and without HTTP.

Each scenario of concurrency 1 (benchmarks/load.py) is answered, in turn and many times, by:
- `floor`: the floor app's answer (benchmarks/floor_app.py): validation, the ONNX runs called directly, rendering;
- `answer`: validation, then the endpoint's answer (the task's service and the batcher);
- `admitted`: the same inside the batcher's admission;
- `deadline`: the same inside the request's deadline (`within_deadline`);
- `app`: the whole ASGI app (the request edge, the route, reading the body, the response).
Each row is a median, and its difference from the row above says what that layer costs. No socket, HTTP parser or
client shares the CPU, so the figures move less from run to run than wrk's. Access lines are off (their formatting
and writing is the log listener's thread's).

    python -m benchmarks.own_cost_layers [--requests 600] [--only knowledge]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable

import numpy as np

from app.core.request_context import request_arrival
from app.core.settings import Settings
from app.main import create_app
from app.runtime.memory import tune_malloc
from app.tasks import TASKS
from app.transports.deadline import within_deadline
from app.transports.http import validate
from benchmarks.floor_app import ANSWERS
from benchmarks.load import Scenario, scenarios
from benchmarks.request_work import call as asgi_call

Call = Callable[[], Awaitable[object]]


def layers(app, scenario: Scenario) -> dict[str, Call]:
    """The calls of each layer for one scenario, innermost first."""
    registry, body = app.state.registry, json.dumps(scenario.body).encode()
    task, endpoint = next((t, e) for t in TASKS.values() for e in t.endpoints if e.path == scenario.path)

    def parsed():
        request = validate(endpoint.request, body)
        return request, registry.get(request.model, task.name)

    async def floor() -> None:
        ANSWERS[scenario.path](registry, body)

    async def answer() -> None:
        request, model = parsed()
        await endpoint.answer(model, request, True)

    async def admitted() -> None:
        request, model = parsed()
        with endpoint.admit(model, request):
            await endpoint.answer(model, request, True)

    async def deadline() -> None:
        request_arrival.set(time.perf_counter())
        request, model = parsed()
        with endpoint.admit(model, request):
            await within_deadline(endpoint.answer(model, request, True), app.state, model.name)

    async def whole_app() -> None:
        if (status := await asgi_call(app, scenario.path, body)) != 200:
            raise RuntimeError(f"{scenario.path} answered {status}")

    return {"floor": floor, "answer": answer, "admitted": admitted, "deadline": deadline, "app": whole_app}


async def measure(requests: int, only: str) -> None:
    app = create_app(Settings(log_level="warning"))  # no access lines on this benchmark's output
    async with app.router.lifespan_context(app):
        for scenario in (s for s in scenarios() if 1 in s.concurrency and only in s.name and s.path in ANSWERS):
            calls = layers(app, scenario)
            seconds: dict[str, list[float]] = {name: [] for name in calls}
            for index in range(requests + 30):  # the first 30 rounds warm up
                for name, call in calls.items():
                    started = time.perf_counter()
                    await asyncio.create_task(call())  # a task each, as a request has: its own context
                    if index >= 30:
                        seconds[name].append(time.perf_counter() - started)
            print(f"\n{scenario.name}: medians of {requests} calls each, in turn")
            print("| layer | p50 ms | over the layer above | over the floor |")
            print("|---|---|---|---|")
            floor = previous = np.median(seconds["floor"])
            for name, values in seconds.items():
                median = np.median(values)
                steps = f"{(median - previous) * 1e3:+.3f} | {(median - floor) * 1e3:+.3f}"
                print(f"| {name} | {median * 1e3:.3f} | {steps} |")
                previous = median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=600, help="calls of each layer per scenario")
    parser.add_argument("--only", default="", help="only the scenarios whose name contains this text")
    args = parser.parse_args()
    tune_malloc()  # as `python -m app` does, before any thread starts
    asyncio.run(measure(args.requests, args.only))


if __name__ == "__main__":
    main()
