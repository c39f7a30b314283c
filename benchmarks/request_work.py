"""The work one request costs, counted rather than timed: the service's ASGI app against the floor app's answer
function (benchmarks/floor_app.py), in process, on the same loaded models and bodies as benchmarks/load.py.

Per scenario: Python function calls per request, grouped by where they run (app modules, libraries, the standard
library; a builtin counts where it is called), for the app and for the floor, and the app's extra calls by group;
the garbage collections per request and the objects per request that only the collector frees (reference cycles).
Counts do not move with the load of a shared machine, so two trees compare in any conditions:

    python -m benchmarks.request_work [--only NAME] [--requests 300]
    PYTHONPATH=/tmp/base python /path/to/this/checkout/benchmarks/request_work.py   # another tree's app
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import pstats
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson

from app.core.settings import Settings
from app.main import create_app
from benchmarks.floor_app import ANSWERS
from benchmarks.load import scenarios


async def call(app, path: str, body: bytes) -> int:
    """One request through the ASGI app, the client connected throughout; its status."""
    headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "scheme": "http", "path": path}
    scope |= {"method": "POST" if body else "GET", "raw_path": path.encode(), "query_string": b"", "root_path": ""}
    scope |= {"headers": headers, "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000), "state": {}}
    messages = iter([{"type": "http.request", "body": body, "more_body": False}])
    status = 0

    async def receive() -> dict:
        return next(messages, None) or await asyncio.Event().wait()

    async def send(message: dict) -> None:
        nonlocal status
        status = message.get("status", status)

    await app(scope, receive, send)
    return status


def group(filename: str) -> str:
    """Where a profiled function runs: an app module, a library, a standard library module or `builtin`."""
    if filename == "~":
        return "builtin"
    parts = Path(filename).parts
    if "site-packages" in parts:
        return parts[parts.index("site-packages") + 1].removesuffix(".py")
    if "app" in parts:
        return "/".join(parts[parts.index("app") :])
    library = next((index for index, part in enumerate(parts) if part.startswith("python3.")), None)
    return Path(filename).name if library is None else "stdlib " + Path(parts[library + 1]).stem


async def calls_per_request(run: Callable[[], Awaitable[object]], requests: int) -> Counter:
    """Calls per request by `group` (a builtin's by its caller's), over `requests` runs after 30 unprofiled ones, each
    in a task of its own as a server runs a request."""
    for _ in range(30):
        await asyncio.create_task(run())
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(requests):
        await asyncio.create_task(run())
    profile.disable()
    counts = Counter()
    for (filename, _, _), (_, calls, _, _, callers) in pstats.Stats(profile).stats.items():
        if filename != "~":
            counts[group(filename)] += calls / requests
        for (caller, _, _), (_, by_caller, *_) in callers.items() if filename == "~" else ():
            counts[group(caller)] += by_caller / requests  # a builtin counts as its caller's work
    return counts


async def collector_work(run: Callable[[], Awaitable[object]], requests: int) -> tuple[list[float], float]:
    """Collections per request of each generation, and objects per request left in reference cycles."""
    gc.collect()
    before = [generation["collections"] for generation in gc.get_stats()]
    for _ in range(requests):
        await asyncio.create_task(run())
    collections = [(g["collections"] - b) / requests for g, b in zip(gc.get_stats(), before, strict=True)]
    gc.collect()
    gc.disable()
    for _ in range(requests):
        await asyncio.create_task(run())
    cyclic = gc.collect() / requests
    gc.enable()
    return collections, cyclic


async def report(app, name: str, path: str, body: bytes, requests: int) -> None:
    """One scenario's counts: the app's and the floor's calls, the app's extra calls by group, the collector's work."""

    async def served() -> None:
        await call(app, path, body)

    async def floored() -> None:
        ANSWERS[path](app.state.registry, body)

    by = {"app": await calls_per_request(served, requests), "floor": await calls_per_request(floored, requests)}
    collections, cyclic = await collector_work(served, requests)
    print(f"{name}: app {sum(by['app'].values()):.0f} calls per request, floor {sum(by['floor'].values()):.0f}")
    per_generation = ", ".join(f"{count:.3f}" for count in collections)
    print(f"  garbage collections per request (generations 0, 1, 2): {per_generation}; objects in cycles: {cyclic:.1f}")
    extra = Counter({where: by["app"][where] - by["floor"][where] for where in by["app"] | by["floor"]})
    for where, calls in extra.most_common():
        if abs(calls) >= 0.5:
            print(f"  {calls:+7.1f}  {where}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="only the scenarios whose name contains this text")
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    app = create_app(Settings(log_level="warning"))
    lifespan: asyncio.Queue[dict] = asyncio.Queue()
    started = asyncio.Event()
    await lifespan.put({"type": "lifespan.startup"})

    async def lifespan_send(message: dict) -> None:
        if message["type"] == "lifespan.startup.failed":
            raise RuntimeError(message.get("message", "the app did not start"))
        started.set()

    serving = asyncio.create_task(
        app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, lifespan.get, lifespan_send)
    )
    await started.wait()
    while await call(app, "/ready", b"") != 200:
        await asyncio.sleep(0.1)
    gc.collect()
    gc.freeze()  # as each worker of `python -m app` does once started
    for scenario in scenarios():
        if scenario.path in ANSWERS and args.only in scenario.name and "batch" not in scenario.path:
            await report(app, scenario.name, scenario.path, orjson.dumps(scenario.body), args.requests)
    await lifespan.put({"type": "lifespan.shutdown"})
    await serving


if __name__ == "__main__":
    asyncio.run(main())
