"""Real uvicorn processes on free ports: ready, served, one access line per request, graceful SIGTERM, and a
warning at startup naming the supported command, which has the limits a bare uvicorn lacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.helpers import free_port, run_app, running_server
from tests.toy_model import write_empty_manifest

pytestmark = pytest.mark.slow  # each test starts a server, a browser or a training run: seconds (-m "not slow")

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def _uvicorn(target: list[str], artifacts: Path, server: str = "uvicorn") -> Iterator[tuple[str, list[str]]]:
    """Start `python -m uvicorn <target>` (or gunicorn's) on a free port; yield its URL once /ready is 200, then
    SIGTERM it.

    The list yielded fills with the process output lines after it stops.
    """
    port = free_port()
    env = {
        **os.environ,
        "MNEMO_ARTIFACTS_DIR": str(artifacts),
        "MNEMO_PROVIDER": "cpu",
        "MNEMO_INTRA_OP_THREADS": "1",
        "MNEMO_LOG_FORMAT": "json",
    }
    where = ["--bind", f"127.0.0.1:{port}"] if server == "gunicorn" else ["--host", "127.0.0.1", "--port", str(port)]
    command = [sys.executable, "-m", server, *target, *where]
    process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url, output = f"http://127.0.0.1:{port}", []
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{server} never became ready: {process.communicate(timeout=10)[0]}")
            time.sleep(0.2)
        yield url, output
    finally:
        process.terminate()
        output += process.communicate(timeout=30)[0].splitlines()
        assert process.returncode in (0, -15)


@pytest.mark.parametrize(
    ("server", "target"),
    [("uvicorn", ["app.main:app"]), ("gunicorn", ["app.main:app", "-k", "uvicorn_worker.UvicornWorker"])],
)
def test_module_level_app_under_the_uvicorn_cli_with_an_empty_manifest(tmp_path, server: str, target: list[str]):
    """Served without `python -m app` (uvicorn's CLI, or gunicorn with uvicorn's worker), the app warns once."""
    with _uvicorn(target, write_empty_manifest(tmp_path), server) as (url, output):
        assert httpx.get(f"{url}/ready").json() == {"status": "ready", "models": 0}
        assert httpx.get(f"{url}/models").json() == {"models": []}
    assert any("Application shutdown complete" in line for line in output)
    warnings = [json.loads(line) for line in output if '"warning"' in line and "python -m app" in line]
    assert len(warnings) == 1 and "serve with `python -m app` behind nginx" in warnings[0]["message"]


def test_toy_models_served_by_real_uvicorn_with_one_access_line_per_request(toy_artifacts):
    with _uvicorn(["tests.toy_model:create_toy_app", "--factory"], toy_artifacts) as (url, output):
        response = httpx.post(f"{url}/toy", json={"x": [[1, 2, 3]], "k": [5]}, headers={"X-Request-ID": "srv-1"})
        assert response.status_code == 200 and response.json()["z"] == [6]
        assert response.headers["x-request-id"] == "srv-1"
        assert httpx.get(f"{url}/models").json()["models"][0]["provider"] == "CPUExecutionProvider"
        assert 'mnemo_inference_duration_seconds_count{model="toy-a"} 1.0' in httpx.get(f"{url}/metrics").text
    assert any("Application shutdown complete" in line for line in output)  # SIGTERM handled gracefully
    access = [json.loads(line) for line in output if '"mnemo.access"' in line]
    assert [line["path"] for line in access if line["request_id"] == "srv-1"] == ["/toy"]
    assert not [line for line in output if '"POST /toy HTTP/1.1"' in line]  # uvicorn's own access line is off


def test_python_m_app_does_not_warn_that_it_is_unprotected(toy_artifacts):
    with running_server(toy_artifacts, [sys.executable, "-m", "tests.toy_server"]) as server:  # app/server.py
        assert httpx.get(f"{server.url}/ready").status_code == 200
    assert not [line for line in server.output if "not started by `python -m app`" in line]


def test_a_tampered_model_stops_python_m_app_with_one_line_naming_it(artifacts_copy: Path):
    with (artifacts_copy / "dkvmn-statics.onnx").open("ab") as model:
        model.write(b"x")
    env = {**os.environ, "MNEMO_ARTIFACTS_DIR": str(artifacts_copy), "MNEMO_PORT": str(free_port())}
    env.update(MNEMO_PROVIDER="cpu", MNEMO_INTRA_OP_THREADS="1", MNEMO_HOST="127.0.0.1")
    done = run_app(env, timeout=120)
    assert done.returncode == 3  # gunicorn's status for a worker that failed to boot: it stops rather than retries
    assert "Traceback" not in done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.startswith("mnemo: cannot start:")]
    assert line.startswith("mnemo: cannot start: model dkvmn-statics: model file dkvmn-statics.onnx has sha256 ")
    assert line.endswith("refusing to serve it")


def test_a_workers_socket_waits_unlistened_with_the_options_gunicorn_gave_it():
    """gunicorn's own listening socket (reuse_port) swapped for one bound to its address, not listening, with its
    options: without TCP_NODELAY, which accepted connections inherit, answers written in two parts waited out
    Nagle's delay (students reads: 2,711 -> 360 per s)."""
    import logging
    import socket

    from gunicorn.config import Config
    from gunicorn.sock import TCPSocket

    from app.server import LISTENER_OPTIONS, unlistened

    config = Config()
    config.set("reuse_port", True)
    listener = TCPSocket(("127.0.0.1", free_port()), config, logging.getLogger("test"))
    address, given = listener.getsockname(), {option: listener.getsockopt(*option) for option in LISTENER_OPTIONS}
    fresh = unlistened(listener)
    with fresh:
        assert fresh.getsockname() == address
        assert {option: fresh.getsockopt(*option) for option in LISTENER_OPTIONS} == given
        assert all(given.values())  # each of them set
        assert fresh.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 0
        assert listener.sock is None  # closed
