"""Connection abuse against a real `python -m app` on loopback: what the server does with clients that hold
connections, trickle headers, stall bodies, send huge headers, exhaust file handles or never read.

    python -m benchmarks.connection_abuse [--project DIR] [--seconds 15] [--only idle slowloris ...]

`--project` serves another checkout (e.g. an older commit unpacked with `git archive`) with this
interpreter, to compare. Every scenario is bounded in connections and time and targets 127.0.0.1 only.
Prints one line per scenario.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
SCENARIOS = ["idle", "slowloris", "stalled", "header", "never-read", "fd"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


class Served:
    """`python -m app` of `project` on a free port, optionally under `ulimit -n`."""

    def __init__(self, project: Path, nofile: int | None = None, **env: str) -> None:
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        environment = {
            **os.environ,
            "MNEMO_ARTIFACTS_DIR": str(project / "artifacts"),
            "MNEMO_PORT": str(self.port),
            "MNEMO_PROVIDER": "cpu",
            "MNEMO_INTRA_OP_THREADS": "1",
            "MNEMO_LOG_LEVEL": "warning",
            **env,
        }
        command = f"ulimit -n {nofile}; " if nofile else ""
        command += f"exec {sys.executable} -m app"
        self.log = open(f"/tmp/connection-abuse-{self.port}.log", "w")  # noqa: SIM115
        self.process = subprocess.Popen(
            ["bash", "-c", command], env=environment, cwd=project, stdout=self.log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/ready", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.2)
        raise RuntimeError("server not ready")

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


async def health_probe(url: str, stop: asyncio.Event, samples: list[float | str]) -> None:
    """/health every 0.25 s: the latency in ms, or what went wrong."""
    async with httpx.AsyncClient(timeout=5) as client:
        while not stop.is_set():
            started = time.perf_counter()
            try:
                response = await client.get(f"{url}/health", headers={"Connection": "close"})
                samples.append(
                    (time.perf_counter() - started) * 1000 if response.status_code == 200 else str(response.status_code)
                )
            except httpx.HTTPError as error:
                samples.append(type(error).__name__)
            await asyncio.sleep(0.25)


async def hold(port: int, count: int, seconds: float, behave: Callable[[asyncio.StreamWriter], Awaitable[None]]):
    """Open `count` connections, run `behave` on each for up to `seconds`; how many the server closed, when."""
    closed_at: list[float] = []
    answers: dict[str, int] = {}
    started = time.monotonic()

    async def one() -> None:
        try:
            reader, writer = await asyncio.open_connection(HOST, port)
        except OSError as error:
            answers[type(error).__name__] = answers.get(type(error).__name__, 0) + 1
            return
        activity = asyncio.ensure_future(_quietly(behave(writer)))
        try:
            head = await asyncio.wait_for(reader.read(200), seconds)
            if head:
                status = head.split(b" ", 2)[1].decode() if head.startswith(b"HTTP/") else "other"
                answers[status] = answers.get(status, 0) + 1
                await asyncio.wait_for(reader.read(), max(0.1, seconds - (time.monotonic() - started)))
            closed_at.append(time.monotonic() - started)
        except (TimeoutError, ConnectionError):
            if not writer.is_closing() and reader.at_eof():
                closed_at.append(time.monotonic() - started)
        finally:
            activity.cancel()
            writer.close()

    await asyncio.gather(*(one() for _ in range(count)))
    return closed_at, answers


async def _quietly(work: Awaitable[None]) -> None:
    """The client's own traffic; the server closing on it is expected."""
    with contextlib.suppress(ConnectionError):
        await work


def summary(name: str, count: int, closed_at: list[float], answers: dict, health: list, extra: str = "") -> str:
    latencies = sorted(value for value in health if isinstance(value, float))
    failures = [value for value in health if not isinstance(value, float)]
    closed = f"{len(closed_at)}/{count} closed by the server"
    if closed_at:
        closed += f" (median at {sorted(closed_at)[len(closed_at) // 2]:.1f}s)"
    health_text = f"/health max {latencies[-1]:.0f} ms" if latencies else "/health never answered"
    health_text += f", {len(failures)} failed of {len(health)}" + (f" ({sorted(set(failures))})" if failures else "")
    return f"{name}: {closed}; answers {json.dumps(answers, sort_keys=True)}; {health_text}{extra}"


async def scenario(served: Served, name: str, count: int, seconds: float, behave) -> str:
    stop, health = asyncio.Event(), []
    probe = asyncio.ensure_future(health_probe(served.url, stop, health))
    closed_at, answers = await hold(served.port, count, seconds, behave)
    stop.set()
    await probe
    return summary(name, count, closed_at, answers, health)


async def idle(writer: asyncio.StreamWriter) -> None:
    await asyncio.sleep(3600)


async def slowloris(writer: asyncio.StreamWriter) -> None:
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    for _ in range(3600):
        await asyncio.sleep(1)
        writer.write(b"X-a: b\r\n")


async def stalled_body(writer: asyncio.StreamWriter) -> None:
    writer.write(
        b"POST /similarity HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
    )
    await asyncio.sleep(3600)


async def huge_header(served: Served) -> str:
    stop, health = asyncio.Event(), []
    probe = asyncio.ensure_future(health_probe(served.url, stop, health))
    started = time.monotonic()
    reader, writer = await asyncio.open_connection(HOST, served.port)
    status = "none"
    try:
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ")
        chunk = b"a" * (1 << 20)
        for _ in range(64):
            if reader.at_eof() or writer.is_closing():
                break
            writer.write(chunk)
            await asyncio.wait_for(writer.drain(), 10)
        writer.write(b"\r\n\r\n")
        await writer.drain()
        head = await asyncio.wait_for(reader.read(200), 30)
        status = head.split(b" ", 2)[1].decode() if head else "closed"
    except (ConnectionError, TimeoutError) as error:
        head = b""
        status = type(error).__name__
        try:
            head = await asyncio.wait_for(reader.read(200), 2)
            status = head.split(b" ", 2)[1].decode() if head.startswith(b"HTTP/") else status
        except (ConnectionError, TimeoutError):
            pass
    writer.close()
    elapsed = time.monotonic() - started
    stop.set()
    await probe
    return summary("64 MB header", 1, [elapsed], {status: 1}, health, f"; answered after {elapsed:.1f}s")


async def fd_exhaustion(served: Served, sockets: int, seconds: float) -> str:
    """`sockets` idle connections against a server under `ulimit -n 1024`; can others still get in?"""
    stop, health = asyncio.Event(), []
    probe = asyncio.ensure_future(health_probe(served.url, stop, health))
    closed_at, answers = await hold(served.port, sockets, seconds, idle)
    stop.set()
    await probe
    try:
        after = str(httpx.get(f"{served.url}/health", timeout=5).status_code)
    except httpx.HTTPError as error:
        after = type(error).__name__
    name = f"{sockets} idle sockets, ulimit -n 1024"
    return summary(name, sockets, closed_at, answers, health, f"; /health once they are gone: {after}")


async def never_read(served: Served, clients: int, seconds: float) -> str:
    """`clients` ask for a 4.8 MB knowledge-trace answer and never read it; the server's RSS over time."""
    history = [{"question": 1 + index % 100, "correct": index % 3 == 0} for index in range(10_000)]
    body = json.dumps({"model": "dkvmn-assist2009", "interactions": history, "return_attention": True}).encode()
    request = (
        b"POST /knowledge-trace HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    before = served.rss_mb()
    sockets = []
    for _ in range(clients):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((HOST, served.port))
        sock.sendall(request)
        sockets.append(sock)
    rss, started = [], time.monotonic()
    while time.monotonic() - started < seconds:
        rss.append((time.monotonic() - started, served.rss_mb()))
        await asyncio.sleep(1)
    after = served.rss_mb()
    kept = 0  # answers still delivered whole after the wait: the server held them for a client that never read
    for sock in sockets:
        kept += delivered_whole(sock)
        sock.close()
    peak = max(value for _, value in rss)
    return (
        f"{clients} clients never reading 4.8 MB answers: RSS {before:.0f} MB before, peak {peak:.0f} MB, "
        f"{after:.0f} MB after {seconds:.0f}s; {kept}/{clients} answers still held for them"
    )


def delivered_whole(sock: socket.socket) -> bool:
    """Read what the server still sends; True if that is a whole 200 response (head and Content-Length body)."""
    sock.settimeout(2)
    received = b""
    try:
        while chunk := sock.recv(1 << 20):
            received += chunk
            head, _, body = received.partition(b"\r\n\r\n")
            length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
            if length and len(body) >= int(length.group(1)):
                return head.startswith(b"HTTP/1.1 200")
    except (TimeoutError, ConnectionResetError):
        pass
    return False


async def main_async(project: Path, seconds: float, only: set[str]) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    if only & {"idle", "slowloris", "stalled", "header"}:
        served = Served(project)
        try:
            if "idle" in only:
                print(await scenario(served, "1000 idle connections", 1000, seconds, idle), flush=True)
            if "slowloris" in only:
                print(await scenario(served, "500 slowloris connections", 500, seconds, slowloris), flush=True)
            if "stalled" in only:
                print(await scenario(served, "300 stalled bodies", 300, seconds, stalled_body), flush=True)
            if "header" in only:
                print(await huge_header(served), flush=True)
        finally:
            served.stop()
    if "never-read" in only:
        # every one of the answers gets computed: no deadline, no queue limit
        patient = Served(project, MNEMO_REQUEST_TIMEOUT_S="300", MNEMO_MAX_QUEUE="100000")
        try:
            print(await never_read(patient, 50, 90), flush=True)
        finally:
            patient.stop()
    if "fd" in only:
        limited = Served(project, nofile=1024)
        try:
            print(await fd_exhaustion(limited, 1100, seconds), flush=True)
        finally:
            limited.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--project", type=Path, default=ROOT, help="checkout to serve (default: this one)")
    parser.add_argument("--seconds", type=float, default=15, help="how long each scenario holds its connections")
    parser.add_argument("--only", nargs="+", choices=SCENARIOS, default=SCENARIOS, help="scenarios to run")
    args = parser.parse_args(argv)
    asyncio.run(main_async(args.project.resolve(), args.seconds, set(args.only)))


if __name__ == "__main__":
    main()
