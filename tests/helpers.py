"""Helpers shared by the tests: the one way they start the app (`app_client`: in process, over TestClient;
`running_server`: a real `python -m app`, uvicorn or toy server process on a free port; `run_app`: a
`python -m app` expected to exit), waits on a live server's metrics, and a comparison of JSON answers up to
float noise."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from fastapi.testclient import TestClient

from app.core.settings import Settings
from app.main import create_app
from tests.toy_model import toy_app

ROOT = Path(__file__).resolve().parents[1]
TOY_SERVER = [sys.executable, "-m", "tests.toy_server"]  # the toy app behind the real server (tests/toy_server.py)


def same_answer(left: object, right: object, tolerance: float = 1e-5) -> bool:
    """Two JSON answers equal except for floats within `tolerance`: a result may differ in the last bits with
    the batch it ran in (the issue's bound is 1e-5)."""
    if isinstance(left, float) or isinstance(right, float):
        return isinstance(left, int | float) and isinstance(right, int | float) and abs(left - right) <= tolerance
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(same_answer(left[key], right[key], tolerance) for key in left)
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(same_answer(a, b, tolerance) for a, b in zip(left, right, strict=True))
    return left == right


def app_settings(artifacts: Path, **overrides) -> Settings:
    """The settings the tests serve with: the given artifacts, CPU, one intra-op thread; any setting overridden."""
    return Settings(**{"artifacts_dir": artifacts, "provider": "cpu", "intra_op_threads": 1, **overrides})


@contextmanager
def app_client(
    artifacts: Path, *, toy: bool = False, raise_server_exceptions: bool = True, **overrides
) -> Iterator[TestClient]:
    """The real app, started (its lifespan run) in a TestClient, on `app_settings(artifacts, **overrides)`:
    serving the real tasks, or the toy tasks of tests/toy_model.py with `toy`."""
    settings = app_settings(artifacts, **overrides)
    app = toy_app(settings) if toy else create_app(settings)
    with TestClient(app, raise_server_exceptions=raise_server_exceptions) as client:
        yield client


def run_app(env: dict[str, str], *arguments: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """`python -m app` run to its exit from the checkout, with `env` as its whole environment; output captured."""
    command = [sys.executable, "-m", "app", *arguments]
    return subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Server:
    url: str
    process: subprocess.Popen
    output: list[str] = field(default_factory=list)  # the process output, line by line, as it arrives


@contextmanager
def running_server(
    artifacts: Path, command: list[str] | None = None, ready_timeout_s: float = 90, **env: str
) -> Iterator[Server]:
    """Start `python -m app` (or `command`; `{port}` in it is replaced) on a free loopback port.

    Yields once /ready is 200; on exit sends SIGTERM (if still running) and waits for it. The output is
    read all along (a full pipe would block the server's logging), into `server.output`.
    """
    port = free_port()
    environment = {
        **os.environ,
        "MNEMO_ARTIFACTS_DIR": str(artifacts),
        "MNEMO_HOST": "127.0.0.1",
        "MNEMO_PORT": str(port),
        "MNEMO_PROVIDER": "cpu",
        "MNEMO_INTRA_OP_THREADS": "1",
        "MNEMO_LOG_FORMAT": "json",
        **env,
    }
    argv = [sys.executable, "-m", "app"] if command is None else [part.format(port=port) for part in command]
    process = subprocess.Popen(
        argv, env=environment, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    server = Server(f"http://127.0.0.1:{port}", process)
    reader = threading.Thread(target=_collect_lines, args=(process, server.output), daemon=True)
    reader.start()  # drain the pipe while it runs: a full pipe would block the server's logging
    try:
        deadline = time.monotonic() + ready_timeout_s
        while True:
            if process.poll() is not None:
                reader.join(timeout=5)
                raise RuntimeError(f"server exited with {process.returncode}: {server.output[-20:]}")
            try:
                if httpx.get(f"{server.url}/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("server never became ready")
            time.sleep(0.1)
        yield server
    finally:
        if process.poll() is None:
            process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        reader.join(timeout=10)


def _collect_lines(process: subprocess.Popen, lines: list[str]) -> None:
    for line in process.stdout:
        lines.append(line.rstrip("\n"))


class HeldRequest:
    """A POST whose body arrives in two parts: the server has admitted it (it is in flight) until `finish`.

    Drain tests use it to keep a server draining for as long as they need, whatever the machine's speed.
    """

    def __init__(self, url: str, path: str, body: bytes) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=60)
        head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
        self.sock.sendall(head.encode() + b"\r\n\r\n" + body[: len(body) // 2])
        self.rest = body[len(body) // 2 :]

    def finish(self) -> tuple[int, bytes]:
        """Send the rest of the body; the status and the body of the answer."""
        self.sock.sendall(self.rest)
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += self._recv()
        head, body = answer.split(b"\r\n\r\n", 1)
        fields = dict(line.split(b":", 1) for line in head.lower().split(b"\r\n")[1:])
        length = int(fields[b"content-length"])
        while len(body) < length:
            body += self._recv()
        self.sock.close()
        return int(head.split()[1]), body

    def _recv(self) -> bytes:
        chunk = self.sock.recv(65536)
        assert chunk, "the server closed the connection before answering"
        return chunk


def metric(url: str, line_start: str) -> float:
    """The value of the first /metrics line starting with `line_start` (0 when there is none yet)."""
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(line_start):
            return float(line.split()[-1])
    return 0.0


async def until_metric(url: str, line_start: str, value: float) -> None:
    """Wait (at most 30 s, else fail) until the metric line starting with `line_start` reaches `value`."""
    deadline = time.monotonic() + 30
    while (now := metric(url, line_start)) < value:
        assert time.monotonic() < deadline, f"{line_start} is {now} after 30 s, not {value}"
        await asyncio.sleep(0.02)


async def until_admitted(url: str, rows: int, model: str = "toy-a") -> None:
    """Wait until `model` holds `rows` admitted rows: the requests sent have arrived."""
    await until_metric(url, f'mnemo_admitted_rows{{model="{model}"}}', rows)


def release_held_runs(server: Server) -> None:
    """Let a toy server's held run (`python -m tests.toy_server`, a row of k == HELD_K) finish: SIGUSR1 to its
    workers (gunicorn's master passes no signal on once it is stopping)."""
    for worker in children(server.process.pid):
        os.kill(worker, signal.SIGUSR1)


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (gunicorn's workers, for its master)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process has gone
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found
