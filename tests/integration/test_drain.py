"""Graceful drain of a real `python -m app` on the committed models: SIGTERM with 32 requests in flight."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from app.server import ECHO_S
from tests.conftest import COMMITTED
from tests.helpers import HeldRequest, Server, children, free_port, running_server

pytestmark = pytest.mark.slow  # each test starts a server, a browser or a training run: seconds (-m "not slow")

IN_FLIGHT = 32
# a held body arrives when the test sends its rest, seconds later on a slow host: its deadline, counted from its
# arrival, must outlast the hold, or admission answers it 429 (it could not be done within half the deadline)
HOLDING = {"MNEMO_BODY_TIMEOUT_S": "60", "MNEMO_REQUEST_TIMEOUT_S": "60"}


def _history(length: int) -> dict:
    interactions = [{"question": i % 110 + 1, "correct": i % 3 != 0} for i in range(length)]
    return {"model": "dkvmn-assist2009", "interactions": interactions, "next_questions": [1], "return_attention": False}


def _in_flight(url: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    return next(
        float(line.split()[-1]) for line in text.splitlines() if line.startswith("mnemo_http_requests_in_flight")
    )


def _hold_one_request(server: Server) -> HeldRequest:
    """A 5-interaction /knowledge-trace request whose body is held back, once the server counts it in flight (the
    server started with HOLDING)."""
    held = HeldRequest(server.url, "/knowledge-trace", json.dumps(_history(5)).encode())
    deadline = time.monotonic() + 20
    while _in_flight(server.url) < 2 and time.monotonic() < deadline:  # the held request and /metrics
        time.sleep(0.02)
    return held


def _open_connections(url: str) -> int:
    """Established connections to the server's port."""
    port = url.rsplit(":", 1)[1]
    listing = subprocess.run(["ss", "-Htn", "state", "established", f"sport = :{port}"], capture_output=True, text=True)
    return len(listing.stdout.splitlines())


def _draining(server: Server, workers: int = 1) -> bool:
    """Every one of `workers` logged that a signal (SIGTERM, SIGINT...) started its drain."""
    messages = [json.loads(line)["message"] for line in server.output if line.startswith("{")]
    return sum(bool(re.match(r"SIG[A-Z]+: draining ", message)) for message in messages) >= workers


def test_sigterm_answers_every_admitted_request_refuses_new_ones_and_exits_cleanly():
    async def scenario(server: Server):
        limits = httpx.Limits(max_connections=IN_FLIGHT + 8)
        async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as client:
            held = HeldRequest(server.url, "/knowledge-trace", json.dumps(_history(5)).encode())  # keeps it draining
            admitted = [
                asyncio.create_task(client.post("/knowledge-trace", json=_history(1000))) for _ in range(IN_FLIGHT)
            ]
            deadline = time.monotonic() + 20
            while _in_flight(server.url) < IN_FLIGHT + 2 and time.monotonic() < deadline:  # +2: held, /metrics
                await asyncio.sleep(0.02)
            server.process.send_signal(signal.SIGTERM)
            while not _draining(server):
                assert time.monotonic() < deadline + 20, "the server never logged its drain"
                await asyncio.sleep(0.02)
            async with httpx.AsyncClient(base_url=server.url, timeout=10) as newcomer:
                late = await newcomer.post("/knowledge-trace", json=_history(5))
                ready = await newcomer.get("/ready")
                metrics = (await newcomer.get("/metrics")).text
            answers = await asyncio.gather(*admitted)
            return answers, late, ready, metrics, await asyncio.to_thread(held.finish)

    env = {"MNEMO_DRAIN_S": "120", "MNEMO_REQUEST_TIMEOUT_S": "120", "MNEMO_BODY_TIMEOUT_S": "120"}
    with running_server(COMMITTED, **env) as server:
        answers, late, ready, metrics, (held_status, held_body) = asyncio.run(scenario(server))
        assert [answer.status_code for answer in answers] == [200] * IN_FLIGHT
        assert all(len(answer.json()["predictions"]) == 1000 for answer in answers)
        assert late.status_code == 503 and late.headers["retry-after"] == "1" and late.headers["connection"] == "close"
        assert ready.status_code == 503
        assert 'mnemo_server_requests_rejected_total{reason="draining"} 1.0' in metrics.splitlines()
        assert held_status == 200 and len(json.loads(held_body)["predictions"]) == 5
        assert server.process.wait(timeout=60) == 0
    logged = [json.loads(line) for line in server.output if line.startswith("{")]
    assert any(line["message"] == "drained: no request in flight" for line in logged)


def _signal_pending(pid: int, signum: int) -> bool:
    """`signum` waits to be delivered to the (stopped) process: bit signum-1 of ShdPnd in /proc/PID/status."""
    status = Path(f"/proc/{pid}/status").read_text()
    pending = int(next(line.split()[1] for line in status.splitlines() if line.startswith("ShdPnd:")), 16)
    return bool(pending >> (signum - 1) & 1)


def _stopped(pid: int) -> bool:
    """Every thread of the process is stopped (SIGSTOP takes effect in each thread on its own)."""
    return all(
        (task / "stat").read_text().rsplit(")", 1)[1].split()[0] == "T" for task in Path(f"/proc/{pid}/task").iterdir()
    )


def _answer(sock: socket.socket) -> tuple[int, dict[bytes, bytes]]:
    """The status and headers of the answer on `sock`, whose body is read to its Content-Length."""
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection before answering"
        answer += chunk
    head, body = answer.split(b"\r\n\r\n", 1)
    fields = dict(line.split(b": ", 1) for line in head.lower().split(b"\r\n")[1:])
    while len(body) < int(fields[b"content-length"]):
        body += sock.recv(65536)
    return int(head.split()[1]), fields


def test_requests_sent_before_sigterm_on_accepted_connections_are_answered_even_if_not_yet_read():
    """The worker is stopped while the requests arrive, so it reads them only after SIGTERM has started its drain:
    sent before the signal, on connections it had accepted, they are served (200, then the connection closes)."""
    body = json.dumps(_history(5)).encode()
    with running_server(COMMITTED) as server:
        (worker,) = children(server.process.pid)
        host, port = server.url.removeprefix("http://").split(":")
        sockets = [socket.create_connection((host, int(port)), timeout=30) for _ in range(8)]
        for sock in sockets:  # accepted by the worker: one answer each, the connection kept alive
            sock.sendall(f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            assert _answer(sock)[0] == 200
        os.kill(worker, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 30
            while not _stopped(worker):  # then SIGTERM stays pending until SIGCONT
                assert time.monotonic() < deadline, "the worker did not stop"
                time.sleep(0.01)
            head = f"POST /knowledge-trace HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            for sock in sockets:
                sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
            server.process.send_signal(signal.SIGTERM)  # gunicorn passes it on to the stopped worker
            while not _signal_pending(worker, signal.SIGTERM):
                assert time.monotonic() < deadline, "gunicorn did not pass SIGTERM on"
                time.sleep(0.01)
        finally:
            os.kill(worker, signal.SIGCONT)
        answers = [_answer(sock) for sock in sockets]
        assert [status for status, _ in answers] == [200] * len(sockets)
        assert all(fields[b"connection"] == b"close" for _, fields in answers)
        assert server.process.wait(timeout=60) == 0


def test_a_request_still_in_flight_when_the_drain_times_out_gets_a_503_in_the_service_shape():
    """Past MNEMO_DRAIN_S the drain gives up on what is left: a JSON 503 with Retry-After, not the bare
    text/plain 500 that uvicorn's own cancellation at shutdown sends."""
    with running_server(COMMITTED, MNEMO_DRAIN_S="1", **HOLDING) as server:
        held = _hold_one_request(server)
        deadline = time.monotonic() + 20
        server.process.send_signal(signal.SIGTERM)
        while not any("drain timeout" in line for line in server.output):  # the held request is still in flight
            assert time.monotonic() < deadline + 20, "the drain never timed out"
            time.sleep(0.02)
        status, body = held.finish()
        assert status == 503 and "MNEMO_DRAIN_S" in json.loads(body)["detail"]
        assert server.process.wait(timeout=30) == 0
    logged = [json.loads(line)["message"] for line in server.output if line.startswith("{")]
    assert any(message.startswith("drain timeout: 1 request(s) in flight after 1s, answered 503") for message in logged)


@pytest.mark.parametrize("to_master", [False, True], ids=["worker", "master"])
def test_sigint_during_the_drain_answers_a_request_whose_body_is_still_arriving_503_not_500(to_master: bool):
    """A second signal (SIGINT: stop now; gunicorn's master passes it on as SIGQUIT) while a body is half sent:
    uvicorn's exit would cancel the request and answer its text/plain 500 (SIGQUIT killed the worker); the server
    answers it 503 before it stops, without waiting for the rest of the body."""
    with running_server(COMMITTED, **HOLDING) as server:
        (worker,) = children(server.process.pid)
        held = _hold_one_request(server)
        server.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while not _draining(server):
            assert time.monotonic() < deadline, "the drain never began"
            time.sleep(0.02)
        time.sleep(ECHO_S)  # a signal sooner is the first one's echo (to the process group, passed on by the master)
        os.kill(server.process.pid if to_master else worker, signal.SIGINT)
        answer = b""
        while chunk := held.sock.recv(65536):  # the answer, then the close, with the body's rest never sent
            answer += chunk
        held.sock.close()
        assert server.process.wait(timeout=30) == 0
    head, body = answer.split(b"\r\n\r\n", 1)
    assert int(head.split()[1]) == 503 and "MNEMO_DRAIN_S" in json.loads(body)["detail"]


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_the_whole_process_group_drains(stop: signal.Signals):
    """Ctrl-C in a terminal, or systemd's default stop, signals the worker and gunicorn's master, which passes it on:
    the worker gets it twice at once, and drains (the second is the echo, not a second signal that stops it now)."""
    with running_server(COMMITTED, **HOLDING) as server:
        (worker,) = children(server.process.pid)
        held = _hold_one_request(server)
        os.kill(worker, stop)
        server.process.send_signal(stop)
        deadline = time.monotonic() + 30
        while not _draining(server):
            assert time.monotonic() < deadline, "the drain never began"
            time.sleep(0.02)
        time.sleep(2 * ECHO_S)
        assert held.finish()[0] == 200
        assert server.process.wait(timeout=30) == 0


def test_sigint_to_the_server_drains_it_as_sigterm_does():
    """gunicorn's master passes SIGINT on as SIGQUIT, which killed the worker at once (its default action)."""
    with running_server(COMMITTED, **HOLDING) as server:
        held = _hold_one_request(server)
        server.process.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 30
        while not _draining(server):
            assert time.monotonic() < deadline, "the drain never began"
            time.sleep(0.02)
        assert held.finish()[0] == 200
        assert server.process.wait(timeout=30) == 0


def test_sighup_replaces_the_workers_and_the_old_one_drains_its_requests_in_flight():
    """SIGHUP is gunicorn's reload: new workers start, and the old one drains what it admitted before it exits."""
    with running_server(COMMITTED, **HOLDING) as server:
        held = _hold_one_request(server)
        deadline = time.monotonic() + 20
        server.process.send_signal(signal.SIGHUP)
        while not any("SIGTERM: draining (1 request(s) in flight" in line for line in server.output):
            assert server.process.poll() is None, f"exit {server.process.returncode}: {server.output[-5:]}"
            assert time.monotonic() < deadline + 20, server.output[-5:]
            time.sleep(0.02)
        status, body = held.finish()
        assert status == 200 and len(json.loads(body)["predictions"]) == 5
        while sum("serving:" in line for line in server.output) < 2:  # the new worker
            assert time.monotonic() < deadline + 60, server.output[-5:]
            time.sleep(0.05)
        # the old worker answers 503 to what it still accepts until its drain ends; then only the new one serves (a
        # connection still queued on the old worker's own socket, SO_REUSEPORT, as it closes it is reset: asked again)
        while _status_unless_reset(f"{server.url}/ready") != 200:
            assert time.monotonic() < deadline + 60, server.output[-5:]
            time.sleep(0.05)
        assert server.process.poll() is None


def _status_unless_reset(url: str) -> int | None:
    try:
        return httpx.get(url).status_code
    except (httpx.ReadError, httpx.RemoteProtocolError):  # reset, or closed before an answer
        return None


def _catches_sigterm(pid: int) -> bool:
    """The process has a handler for SIGTERM (bit 14 of SigCgt in /proc/PID/status)."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(caught >> (signal.SIGTERM - 1) & 1)


def _onnxruntime_loaded(pid: int) -> bool:
    return "onnxruntime_pybind11_state" in Path(f"/proc/{pid}/maps").read_text()


def _starting_server(**env: str) -> subprocess.Popen:
    environment = {**os.environ, "MNEMO_ARTIFACTS_DIR": str(COMMITTED), "MNEMO_PORT": str(free_port()), **env}
    command = [sys.executable, "-m", "app"]
    return subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


# a `sitecustomize` that holds the server at its first import of GATED (its first import after `python -m app` began):
# it writes the file named by MNEMO_TEST_AT_GATE, then sleeps, which a signal's handler interrupts by raising
IMPORT_GATE = """
import os, sys, time

class Gate:
    def find_spec(self, name, path=None, target=None):
        if name == {gated!r}:
            sys.meta_path.remove(self)
            open(os.environ["MNEMO_TEST_AT_GATE"], "w").close()
            time.sleep(60)
        return None

sys.meta_path.insert(0, Gate())
"""
GATED = "app.cli"


def _server_held_in_its_imports(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """A starting `python -m app` held before it imports GATED (IMPORT_GATE), and the file it writes once there."""
    gate, at_gate = tmp_path / "gate", tmp_path / "at-gate"
    gate.mkdir()
    (gate / "sitecustomize.py").write_text(IMPORT_GATE.format(gated=GATED))
    path = os.pathsep.join(filter(None, [str(gate), os.environ.get("PYTHONPATH")]))
    return _starting_server(PYTHONPATH=path, MNEMO_TEST_AT_GATE=str(at_gate)), at_gate


def test_sigterm_during_the_imports_stops_the_server_at_once_with_status_0(tmp_path):
    """PID 1 of a container ignores a signal it has no handler for: a `docker stop` during the imports (about
    half a second, before uvicorn's handlers) waited for the stop timeout, then SIGKILL. Elsewhere it was 143.
    The server is held at the start of its imports until SIGTERM, so that the signal arrives there however slow
    the machine is (polling for its handler, the test could send it after gunicorn's had replaced it)."""
    process, at_gate = _server_held_in_its_imports(tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not at_gate.exists():
            assert process.poll() is None and time.monotonic() < deadline, "the server never reached the gate"
            time.sleep(0.01)
        assert _catches_sigterm(process.pid), "SIGTERM went unhandled during the imports"
        assert not _onnxruntime_loaded(process.pid)  # its workers load ONNX Runtime, not the server
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 0, output
    assert "SIGTERM before serving: stopped" in output


def test_sigterm_during_the_workers_imports_stops_them_and_the_server_with_status_0():
    """gunicorn passes SIGTERM on to workers still importing, which stop at once (their handlers are uvicorn's,
    installed once they serve); the server exits 0, not as for a worker that could not start."""
    process = _starting_server(MNEMO_WORKERS="2")
    try:
        children = Path(f"/proc/{process.pid}/task/{process.pid}/children")
        deadline = time.monotonic() + 60
        while len(children.read_text().split()) < 2:
            assert time.monotonic() < deadline, "gunicorn started no workers"
            time.sleep(0.001)
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 0, output
