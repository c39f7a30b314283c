"""Operations over real HTTP: HEAD probes, local docs assets, route labels, process and build metrics, scrapes
rendered off the event loop and shared, uvicorn's own lines in JSON, and a bug's traceback logged once per window."""

from __future__ import annotations

import json
import re
import socket
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import uvicorn
from prometheus_client.core import GaugeMetricFamily

from app.core.metrics import Metrics
from app.core.settings import Settings
from app.main import VERSION, create_app
from tests.conftest import COMMITTED, manifest_models
from tests.helpers import Server, free_port, running_server
from tests.toy_model import write_empty_manifest

pytestmark = pytest.mark.slow  # each test starts a server, a browser or a training run: seconds (-m "not slow")


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running_server(COMMITTED, MNEMO_LOG_FORMAT="json", MNEMO_MAX_BODY_BYTES="2048") as live:
        yield live
    lines = [line for line in live.output if line.strip()]
    for line in lines:  # every line is JSON, uvicorn's own included
        json.loads(line)
    loggers = {json.loads(line)["logger"] for line in lines}
    assert {"uvicorn.error", "mnemo.access"} <= loggers, loggers


@pytest.mark.parametrize("path", ["/health", "/ready"])
def test_head_probes(server, path):
    response = httpx.head(f"{server.url}{path}")
    assert response.status_code == 200 and response.content == b""


@pytest.mark.parametrize("path", ["/docs", "/redoc"])
def test_docs_pages_load_every_asset_from_this_server(server, path):
    page = httpx.get(f"{server.url}{path}")
    assert page.status_code == 200
    urls = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page.text) + re.findall(r"url: ?'([^']+)'", page.text)
    assets = [url for url in urls if url.startswith("/docs-assets/")]
    assert assets, page.text
    assert not [url for url in urls if url.startswith(("http:", "https:", "//"))], urls
    for url in assets:
        asset = httpx.get(f"{server.url}{url}")
        assert asset.status_code == 200 and len(asset.content) > 1000, url


def test_docs_openapi_and_413_answers_are_labelled_by_route(server):
    httpx.get(f"{server.url}/openapi.json")
    httpx.get(f"{server.url}/docs")
    assert httpx.post(f"{server.url}/similarity", content=b"x" * 4096).status_code == 413
    assert httpx.post(f"{server.url}/knowledge-trace", json={"interactions": []}).status_code == 422
    httpx.get(f"{server.url}/no-such-path")
    assert httpx.get(f"{server.url}/docs-assets/swagger-ui.css").status_code == 200  # a Mount rewrites the root_path
    text = httpx.get(f"{server.url}/metrics").text
    assert 'mnemo_http_requests_total{method="GET",route="/docs-assets/{asset:path}",status="200"}' in text
    assert 'mnemo_http_requests_total{method="GET",route="/openapi.json",status="200"}' in text
    assert 'mnemo_http_requests_total{method="GET",route="/docs",status="200"}' in text
    assert 'mnemo_http_requests_total{method="POST",route="/similarity",status="413"}' in text
    assert 'mnemo_http_requests_total{method="POST",route="/knowledge-trace",status="422"}' in text  # direct route
    unmatched = [line for line in text.splitlines() if 'route="unmatched"' in line and "_total" in line]
    assert unmatched == ['mnemo_http_requests_total{method="GET",route="unmatched",status="404"} 1.0'], unmatched


class HeldCollector:
    """A collector on the app's registry whose every collect() waits until the test releases it."""

    def __init__(self) -> None:
        self.calls = 0
        self.entered = threading.Event()
        self.release = threading.Event()

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        self.calls += 1
        self.entered.set()
        self.release.wait(30)
        yield GaugeMetricFamily("test_held_collect_calls", "collect() calls so far", value=self.calls)


@pytest.fixture
def held_server(tmp_path: Path) -> Iterator[tuple[str, HeldCollector, Metrics]]:
    """The app (no models) served by uvicorn in this process, with a HeldCollector on its registry."""
    app = create_app(Settings(artifacts_dir=write_empty_manifest(tmp_path / "artifacts"), provider="cpu"))
    held = HeldCollector()
    app.state.metrics.registry.register(held)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, loop="asyncio", log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", held, app.state.metrics
    finally:
        held.release.set()
        server.should_exit = True
        thread.join(30)


def in_flight(metrics: Metrics) -> float:
    return metrics.in_flight.collect()[0].samples[0].value


def test_a_scrape_renders_off_the_event_loop_and_concurrent_scrapes_share_one_render(held_server):
    url, held, metrics = held_server
    with ThreadPoolExecutor(6) as clients:
        first = clients.submit(httpx.get, f"{url}/metrics", timeout=60)
        assert held.entered.wait(10)  # the first render is in collect(), held
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200  # the loop still answers (it was blocked)
        others = [clients.submit(httpx.get, f"{url}/metrics", timeout=60) for _ in range(5)]
        deadline = time.monotonic() + 10
        while in_flight(metrics) < 6 and time.monotonic() < deadline:  # all six scrapes are in the server
            time.sleep(0.01)
        assert in_flight(metrics) == 6
        held.release.set()
        answers = [first.result(), *(other.result() for other in others)]
    assert [answer.status_code for answer in answers] == [200] * 6
    assert "test_held_collect_calls 1.0" in answers[0].text
    assert all("test_held_collect_calls 2.0" in answer.text for answer in answers[1:])  # one render for the five
    assert held.calls == 2


def test_process_and_build_metrics(server):
    text = httpx.get(f"{server.url}/metrics").text
    for name in ("process_resident_memory_bytes", "process_open_fds", "process_cpu_seconds_total", "python_info"):
        assert re.search(rf"^{name}(\{{.*\}})? ", text, re.MULTILINE), name
    assert f'mnemo_build_info{{version="{VERSION}"}} 1.0' in text
    for model in manifest_models(COMMITTED):
        labels = f'model="{model["name"]}",sha256="{model["sha256"]}",version="{model["version"]}"'
        line = f"mnemo_model_info{{{labels}}} 1.0"
        assert line in text, line


def test_a_bug_logs_one_line_each_time_and_its_traceback_once(toy_artifacts):
    command = [sys.executable, "-m", "uvicorn", "tests.toy_model:create_toy_app", "--factory", "--port", "{port}"]
    with running_server(toy_artifacts, command=command, MNEMO_LOG_FORMAT="json") as live:
        for _ in range(5):
            response = httpx.get(f"{live.url}/toy/bug")
            assert response.status_code == 500
            assert response.json() == {"detail": "Internal error; it has been logged."}
    errors = [json.loads(line) for line in live.output if '"mnemo.errors"' in line]
    assert len(errors) == 5 and all("a deliberate bug" in error["message"] for error in errors)
    assert ["exception" in error for error in errors] == [True, False, False, False, False]
    assert sum("Traceback" in line for line in live.output) == 1  # uvicorn logs no second one


FORGED_PATH = "/x%0d%0a2026-01-01%2000:00:00,000%20INFO%20mnemo.access:%20GET%20/ok%20200%1b%5b2J%00%e2%80%a8%ff"
TEXT_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ [\w.]+: ")


def _raw_get(url: str, target: str) -> bytes:
    """GET `target` sent as is (no client normalises it) on a fresh connection; the whole answer."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as connection:
        connection.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        return b"".join(iter(lambda: connection.recv(65536), b""))


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_client_path_cannot_forge_a_log_line_or_send_terminal_escapes(log_format):
    with running_server(COMMITTED, MNEMO_LOG_FORMAT=log_format) as live:
        assert _raw_get(live.url, FORGED_PATH).startswith(b"HTTP/1.1 404 ")
    lines = [line for line in live.output if line.strip()]
    assert not [line for line in lines if "\x1b" in line or "\x00" in line or "\u2028" in line], lines
    if log_format == "json":
        access = [json.loads(line) for line in lines if '"path": "/x' in line]
        assert [entry["path"][:8] for entry in access] == ["/x%0D%0A"], access  # one line
    else:
        assert [line for line in lines if not TEXT_LINE.match(line)] == [], lines  # no line forged
        access = [line for line in lines if "mnemo.access: GET /x" in line]
        assert len(access) == 1 and "GET /x%0D%0A2026-01-01%2000:00:00,000%20INFO" in access[0], access


def _raw_send(url: str, data: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as connection:
        connection.sendall(data)
        connection.shutdown(socket.SHUT_WR)
        return b"".join(iter(lambda: connection.recv(65536), b""))


def test_a_flood_of_malformed_requests_logs_one_warning_a_second_with_the_count():
    """Malformed requests are refused before the app: no access line, but a warning each, which an operator keeping
    only warnings would see fill the disk at the rate a client sends them."""
    malformed = b"G\x01T / HTTP/1.1\r\nHost: x\r\n\r\n"
    with running_server(COMMITTED, MNEMO_LOG_LEVEL="warning") as live:
        for _ in range(40):
            assert _raw_send(live.url, malformed).startswith(b"HTTP/1.1 400 ")
        time.sleep(1.5)  # the count of those held back is logged when their second is over, without a next one
    messages = [json.loads(line)["message"] for line in live.output if line.startswith("{")]
    invalid = [message for message in messages if message.startswith("Invalid HTTP request")]
    assert len(invalid) <= 8, messages  # a few seconds of flood: a line a second
    held_back = [int(re.search(r"\((\d+) more since the last line\)", message)[1]) for message in invalid[1:]]
    assert len(invalid) == 1 + len(held_back) and sum(held_back) == 39, messages  # every one accounted for


def test_an_unmatched_path_is_one_field_of_the_text_access_line():
    """Spaces in a client's path (sent as %20) would let it add fields: a parser reading the first status and id
    would take the client's."""
    with running_server(COMMITTED, MNEMO_LOG_FORMAT="text") as live:
        assert _raw_get(live.url, "/x%20200%200.1ms%20id=forged").startswith(b"HTTP/1.1 404 ")
    access = [line for line in live.output if "mnemo.access: GET /x" in line]
    assert len(access) == 1 and re.search(r"mnemo\.access: GET \S+ 404 [\d.]+ms id=[0-9a-f]{32}$", access[0]), access


def test_upgrade_requests_log_their_warnings_once_a_second_at_most():
    """Any request with an Upgrade header (h2c, websocket) made uvicorn log two warnings, one of them telling the
    operator to install a WebSocket library, which the service does not use."""
    upgrade = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
    with running_server(COMMITTED, MNEMO_LOG_LEVEL="warning") as live:
        for _ in range(20):
            assert _raw_send(live.url, upgrade).startswith(b"HTTP/1.1 200 ")
    messages = [json.loads(line)["message"] for line in live.output if line.startswith("{")]
    assert sum(message.startswith("Unsupported upgrade request") for message in messages) <= 2, messages
    assert sum(message.startswith("No supported WebSocket library") for message in messages) <= 2, messages
