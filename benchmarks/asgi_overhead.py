"""The service's own cost without sockets: its ASGI app called in-process against the floor app's answer function.

Both answer the same body on the same loaded models, taking turns, so the difference is what the app adds around
the answer (middlewares, routing, admission, batcher, deadline), with no HTTP parsing, socket or client on the
cores. The minimum and the p10 over many calls are reported: on a shared machine they move least. Without the
connection guard (as under plain uvicorn), `complete` watches for a disconnect with a task of its own.

    python -m benchmarks.asgi_overhead /similarity BODY.json 1500
    PYTHONPATH=/tmp/base python benchmarks/asgi_overhead.py ...   # the same on another checkout's app
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import numpy as np

from app.core.settings import Settings
from app.main import create_app
from benchmarks.floor_app import ANSWERS


def http_scope(method: str, path: str, length: int) -> dict:
    headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"), (b"content-length", b"%d" % length)]
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }


async def call(app, method: str, path: str, body: bytes) -> tuple[int, bytes]:
    """One request through the ASGI app: its status and body."""
    delivered, answer = False, {"status": 0, "body": b""}

    async def receive() -> dict:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client stays connected

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            answer["status"] = message["status"]
        elif message["type"] == "http.response.body":
            answer["body"] += message.get("body", b"")

    await app(http_scope(method, path, len(body)), receive, send)
    return answer["status"], answer["body"]


async def measure(path: str, body: bytes, calls: int) -> None:
    app = create_app(Settings(log_level="warning"))
    lifespan_messages: asyncio.Queue[dict] = asyncio.Queue()
    started = asyncio.Event()
    await lifespan_messages.put({"type": "lifespan.startup"})

    async def lifespan_send(message: dict) -> None:
        if message["type"].startswith("lifespan.startup"):
            started.set()

    lifespan = asyncio.create_task(
        app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, lifespan_messages.get, lifespan_send)
    )
    await started.wait()
    while (await call(app, "GET", "/ready", b""))[0] != 200:
        await asyncio.sleep(0.1)
    floor, registry = ANSWERS[path], app.state.registry
    status, served = await call(app, "POST", path, body)
    if status != 200 or served != floor(registry, body):
        raise RuntimeError(f"the app answered {status}, not the floor app's answer")
    app_ms, floor_ms = [], []
    for _ in range(calls):
        begun = time.perf_counter()
        await call(app, "POST", path, body)
        app_ms.append((time.perf_counter() - begun) * 1000)
        begun = time.perf_counter()
        floor(registry, body)
        floor_ms.append((time.perf_counter() - begun) * 1000)
    low = {name: (min(times), np.percentile(times, 10)) for name, times in (("app", app_ms), ("floor", floor_ms))}
    print(
        f"{path} {Path(sys.argv[2]).name}, {calls} calls each: app min {low['app'][0]:.3f} p10 {low['app'][1]:.3f} ms; "
        f"floor min {low['floor'][0]:.3f} p10 {low['floor'][1]:.3f} ms; the app's own cost: min "
        f"{low['app'][0] - low['floor'][0]:.3f}, p10 {low['app'][1] - low['floor'][1]:.3f} ms",
        flush=True,
    )
    await lifespan_messages.put({"type": "lifespan.shutdown"})
    await lifespan


if __name__ == "__main__":
    asyncio.run(measure(sys.argv[1], Path(sys.argv[2]).read_bytes(), int(sys.argv[3])))
