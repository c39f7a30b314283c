"""MNEMO_PROBE_PORT: /health and /ready from a process of their own, over real HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from tests.helpers import TOY_SERVER, free_port, release_held_runs, running_server, until_admitted
from tests.toy_model import HELD_TOY, toy_entry, write_toy_artifacts

pytestmark = pytest.mark.slow  # each test starts a server, a browser or a training run: seconds (-m "not slow")


def test_the_probe_port_answers_health_and_readiness_and_turns_unready_on_sigterm(tmp_path):
    artifacts = write_toy_artifacts(tmp_path / "toy", [toy_entry("toy-a", default=True)])
    probe_port = free_port()
    probes = f"http://127.0.0.1:{probe_port}"
    with running_server(artifacts, TOY_SERVER, MNEMO_PROBE_PORT=str(probe_port), MNEMO_CONCURRENT_RUNS="1") as server:
        assert httpx.get(f"{probes}/health").json() == {"status": "ok"}
        deadline = time.monotonic() + 5  # the probe process reads the readiness it is fed on a thread of its own
        while httpx.get(f"{probes}/ready").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert httpx.get(f"{probes}/ready").json() == {"status": "ready", "models": 1}
        head = httpx.head(f"{probes}/ready")
        assert head.status_code == 200 and head.content == b""
        other = httpx.get(f"{probes}/models")
        assert other.status_code == 404 and "only GET /health and GET /ready" in other.json()["detail"]

        answers = []
        held = threading.Thread(
            target=lambda: answers.append(httpx.post(f"{server.url}/toy", json=HELD_TOY, timeout=60))
        )
        held.start()
        asyncio.run(until_admitted(server.url, 1))
        server.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while httpx.get(f"{probes}/ready").status_code != 503 and time.monotonic() < deadline:
            time.sleep(0.01)
        draining = httpx.get(f"{probes}/ready")
        assert draining.status_code == 503 and "shutting down" in draining.json()["detail"]
        assert httpx.get(f"{probes}/health").status_code == 200  # alive while draining
        release_held_runs(server)
        held.join(60)
        assert answers[0].status_code == 200
        assert server.process.wait(30) == 0


def test_the_probe_server_reports_a_silent_service_unhealthy_and_exits_when_its_stdin_closes():
    port = free_port()
    command = [sys.executable, "-m", "app.transports.probe_server", "127.0.0.1", str(port), "0.5"]
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "listening"
        process.stdin.write('[200, {"status": "ready", "models": 3}]\n')
        process.stdin.flush()
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 5
        while httpx.get(f"{url}/ready").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert httpx.get(f"{url}/ready").json() == {"status": "ready", "models": 3}
        time.sleep(0.7)  # no line for longer than STALE_S: the service's loop is taken for stuck
        silent = httpx.get(f"{url}/health")
        assert silent.status_code == 503 and "has not reported" in silent.json()["detail"]
        process.stdin.close()
        assert process.wait(5) == 0
    finally:
        if process.poll() is None:
            process.kill()


def test_a_taken_probe_port_stops_startup_with_a_clear_message(tmp_path):
    artifacts = write_toy_artifacts(tmp_path / "toy", [toy_entry("toy-a", default=True)])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env = {**os.environ, "MNEMO_ARTIFACTS_DIR": str(artifacts), "MNEMO_PORT": str(free_port())}
        env["MNEMO_PROBE_PORT"] = str(taken.getsockname()[1])
        result = subprocess.run(TOY_SERVER, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "MNEMO_PROBE_PORT" in result.stdout + result.stderr


def test_connections_trickling_their_requests_cannot_hold_every_probe_slot():
    """16 connections (MAX_CONNECTIONS) each sending a byte a second kept every probe unanswered for as long as they
    trickled (the socket timeout bounds each read, not the connection): each connection now ends within 5 s."""
    port = free_port()
    command = [sys.executable, "-m", "app.transports.probe_server", "127.0.0.1", str(port)]
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    held = []
    try:
        assert process.stdout.readline().strip() == "listening"
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(16)]
        started = answered = time.monotonic()
        while time.monotonic() - started < 12:
            for sock in held:
                with contextlib.suppress(OSError):
                    sock.send(b"G")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    answered = time.monotonic()
                    break
            except httpx.HTTPError:
                time.sleep(1)
        assert 0 < answered - started < 8
    finally:
        for sock in held:
            sock.close()
        process.kill()
