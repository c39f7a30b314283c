"""A real `redis-server` for tests: loopback only, a free port, AOF with fsync on every write, in a tmp dir."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis

from tests.helpers import free_port

START_TIMEOUT_S = 10.0
MISSING_REASON = "redis-server is not installed (Debian package redis-server; `make test` installs it)"


def require_redis_server() -> str:
    """The redis-server binary; skip when it is missing, but fail under CI=true, where it must be installed."""
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail(MISSING_REASON + ", and CI must run the Redis tests")
        pytest.skip(MISSING_REASON)
    return binary


class RedisServer:
    """One redis-server process over `directory`; `start` again after `kill` reloads its append-only file."""

    def __init__(self, binary: str, directory: Path) -> None:
        self.binary = binary
        self.directory = directory
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        options = {
            "bind": "127.0.0.1",
            "port": str(self.port),
            "dir": str(self.directory),
            "appendonly": "yes",
            "appendfsync": "always",
            "save": "",
            "daemonize": "no",
            "protected-mode": "yes",
            "logfile": str(self.directory / "redis.log"),
        }
        self.process = subprocess.Popen(
            [self.binary, *(item for name, value in options.items() for item in (f"--{name}", value))],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.5, socket_timeout=0.5)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                if client.ping():
                    break
            except redis.RedisError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    log = (self.directory / "redis.log").read_text(errors="replace")[-2000:]
                    self.kill()
                    raise RuntimeError(f"redis-server did not start on port {self.port}: {log}") from None
                time.sleep(0.05)
        client.close()

    def kill(self) -> None:
        """SIGKILL: no shutdown save, so only what the append-only file already holds survives."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)  # in case a test froze it
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None
