"""Helpers shared by the tests: a free port, and a real `python -m app` (or uvicorn) process on it."""

from __future__ import annotations

import os
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

ROOT = Path(__file__).resolve().parents[1]


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
