"""create_app: the registered task families; settings from MNEMO_*, including the engine's and the thread budget."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import resource
import socket

import pytest
from fastapi.testclient import TestClient

from app.core.settings import DEFAULT_ARTIFACTS_DIR, Settings, usable_cpus
from app.main import create_app
from app.students.io import open_store
from app.tasks import TASKS
from app.transports.middleware import RequestEdge
from benchmarks.request_work import call
from tests.helpers import ROOT, app_settings, free_port, run_app


def test_both_tasks_are_registered_with_their_routes():
    assert set(TASKS) == {"similarity", "knowledge-trace"}
    paths = set(create_app(Settings(provider="cpu")).openapi()["paths"])
    assert {"/similarity", "/similarity/batch", "/knowledge-trace", "/health", "/ready", "/models", "/metrics"} <= paths


def test_the_task_endpoints_are_dispatched_directly_and_documented_by_fastapi():
    """The request edge calls the task endpoints and GET /health without FastAPI's router; the one edge of the app
    holds the one body budget and traceback budget of every request, direct or routed."""
    app = create_app(app_settings(DEFAULT_ARTIFACTS_DIR))
    with TestClient(app) as client:
        assert client.post("/similarity", json={"sentence_a": "a man", "sentence_b": "a dog"}).status_code == 200
        assert client.get("/ready").status_code == 200
    (edge,) = [edge for edge in gc.get_objects() if type(edge) is RequestEdge and edge.drain is app.state.drain]
    paths = ("/similarity", "/similarity/batch", "/embeddings", "/similarity/from-embeddings", "/knowledge-trace")
    assert set(edge.direct) == {("POST", path) for path in paths} | {("GET", "/health")}
    assert all("post" in app.openapi()["paths"][path] for path in paths)


def test_settings_come_from_mnemo_variables(monkeypatch, tmp_path):
    assert Settings().artifacts_dir == DEFAULT_ARTIFACTS_DIR and DEFAULT_ARTIFACTS_DIR.name == "artifacts"
    for name, value in {
        "ARTIFACTS_DIR": str(tmp_path),
        "HOST": "0.0.0.0",
        "PORT": "9001",
        "PROVIDER": "cuda",
        "INTRA_OP_THREADS": "3",
        "LOG_LEVEL": "debug",
        "LOG_FORMAT": "json",
        "MAX_BODY_BYTES": "2048",
        "ON_MODEL_ERROR": "skip",
        "MAX_BATCH": "8",
        "MAX_WAIT_MS": "5",
        "MAX_QUEUE": "100",
        "REQUEST_TIMEOUT_S": "2.5",
        "DRAIN_S": "7",
    }.items():
        monkeypatch.setenv(f"MNEMO_{name}", value)
    settings = Settings()
    assert (settings.artifacts_dir, settings.host, settings.port, settings.provider) == (
        tmp_path,
        "0.0.0.0",
        9001,
        "cuda",
    )
    assert (settings.intra_op_threads, settings.log_level, settings.log_format) == (3, "debug", "json")
    assert (settings.max_body_bytes, settings.on_model_error) == (2048, "skip")
    assert (settings.max_batch, settings.max_wait_ms, settings.max_queue) == (8, 5.0, 100)
    assert (settings.request_timeout_s, settings.drain_s) == (2.5, 7.0)
    monkeypatch.setenv("MNEMO_PROVIDER", "gpu")
    with pytest.raises(ValueError, match="provider"):
        Settings()
    choices = {"PROVIDER": " CPU", "LOG_LEVEL": "INFO", "LOG_FORMAT": "Json", "ON_MODEL_ERROR": "SKIP"}
    for name, value in choices.items():
        monkeypatch.setenv(f"MNEMO_{name}", value)  # a choice in any case
    settings = Settings()
    assert (settings.provider, settings.log_level, settings.log_format, settings.on_model_error) == (
        "cpu",
        "info",
        "json",
        "skip",
    )


def test_the_thread_budget_fits_the_cpus():
    cpus = usable_cpus()
    assert Settings(provider="cpu", intra_op_threads=1).concurrent_runs == cpus
    assert Settings(provider="cpu", intra_op_threads=cpus).concurrent_runs == 1
    with pytest.raises(ValueError, match="exceeds"):
        Settings(provider="cpu", intra_op_threads=cpus, concurrent_runs=2)


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"MNEMO_API_KEYS": ", ,"}, "MNEMO_API_KEYS: holds no API key"),  # was: authentication off
        ({"MNEMO_HOST": ""}, "MNEMO_HOST: String should have at least 1 character"),  # was: every interface
        ({"MNEMO_HOST": "\u202eevil"}, "MNEMO_HOST: String should match pattern '^[!-~]+$'"),  # was: a traceback
        ({"MNEMO_PROBE_PORT": "PORT"}, "MNEMO_PROBE_PORT ({port}) must differ from MNEMO_PORT"),
        ({"MNEMO_STATE_URL": "foo://x"}, "MNEMO_STATE_URL must start with sqlite:// or redis://"),
        ({"MNEMO_STATE_URL": "sqlite:///tmp/x.db?synchronous=off"}, "option synchronous must be one of full, normal"),
        ({"MNEMO_STATE_URL": "redis://:secret@127.0.0.1:notaport/0"}, "Redis URL: its port is not a number"),
        ({"MNEMO_STATE_URL": "redis://:secret@127.0.0.1:6379/abc"}, "database must be a number (redis://host:port/0)"),
        ({"MNEMO_STATE_URL": "redis://127.0.0.1:6379/-1"}, "database must be a number (redis://host:port/0)"),
        # a password with a / # or ? not percent-encoded: its parts read as the port or the database, never echoed
        ({"MNEMO_STATE_URL": "redis://user:secret/x@127.0.0.1:6379/0"}, "port is not a number (a password hold"),
        ({"MNEMO_STATE_URL": "redis://user:secret#x@127.0.0.1:6379/0"}, "port is not a number (a password hold"),
        ({"MNEMO_STATE_URL": "redis://user:1234/secret@127.0.0.1:6379/0"}, "database must be a number"),
        ({"MNEMO_STATE_URL": "redis://user:secret@[::1/0"}, "MNEMO_STATE_URL is not a valid URL: Invalid IPv6 URL"),
        ({"MNEMO_STATE_URL": "sqlite:///tmp"}, "MNEMO_STATE_URL names /tmp, a directory: name a database file"),
        ({"MNEMO_STATE_URL": "NOT_A_DB"}, "pyproject.toml, a file that is not an SQLite database"),  # was: /ready 200
        ({"MNEMO_STATE_URL": "LONG_NAME"}, "/x.db, which cannot be reached: File name too long"),  # was: a traceback
        ({"MNEMO_STATE_URL": "FIFO"}, "students.db, which is not a regular file"),  # was: startup hung opening it
        ({"MNEMO_OPEN_PATHS": "/ready,health"}, "MNEMO_OPEN_PATHS: 'health' is not a path"),  # was: 401
        ({"MNEMO_CORS_ORIGINS": "https://a.example/"}, "'https://a.example/' is not an origin"),
        ({"MNEMO_CORS_ORIGINS": "https://a.example\u202e"}, "'https://a.example\\u202e' is not an origin"),  # not ASCII
        ({"MNEMO_ARTIFACTS_DIR": "/nonexistent"}, "no manifest.json in /nonexistent: set MNEMO_ARTIFACTS_DIR"),
        ({"MNEMO_REQUEST_TIMEOUT_S": "nan"}, "MNEMO_REQUEST_TIMEOUT_S: Input should be a finite number"),
        ({"MNEMO_INTRA_OP_THREADS": "100000"}, "MNEMO_INTRA_OP_THREADS: Input should be less than or equal to 256"),
        ({"MNEMO_MAX_QUEUE": "10000000"}, "MNEMO_MAX_QUEUE: Input should be less than or equal to 1000000"),
        ({"MNEMO_MAX_BODY_BYTES": str(1 << 30)}, "MNEMO_MAX_BODY_BYTES: Input should be less than or equal to 6710"),
        ({"MNEMO_MAX_CONNECTIONS": "FILES"}, "MNEMO_MAX_CONNECTIONS ({files}) needs {needed} open files, past this"),
    ],
)
@pytest.mark.slow
def test_settings_that_cannot_work_stop_startup_with_one_line(variables: dict[str, str], message: str, tmp_path):
    port = str(free_port())
    os.mkfifo(tmp_path / "students.db")
    files = resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 127  # one connection past the open-file limit
    placeholders = {"PORT": port, "FILES": str(files), "NOT_A_DB": f"sqlite://{ROOT / 'pyproject.toml'}"}
    placeholders["LONG_NAME"] = f"sqlite:///tmp/{'a' * 300}/x.db"  # past NAME_MAX: stat fails (as on no access)
    placeholders["FIFO"] = f"sqlite://{tmp_path / 'students.db'}"
    variables = {name: placeholders.get(value, value) for name, value in variables.items()}
    env = {**os.environ, "MNEMO_PORT": port, **variables}
    done = run_app(env)
    assert done.returncode == 1
    expected = message.format(port=port, files=files, needed=files + 128)
    assert done.stderr.startswith("mnemo: cannot start:") and expected in done.stderr
    assert "MNEMO_SETTINGS" not in done.stderr  # a rule across settings names them itself
    assert len(done.stderr.strip().splitlines()) == 1 and "secret" not in done.stderr


@pytest.mark.parametrize("url", ["redis://user:secret/x@127.0.0.1:6379/0", "redis://user:1234/secret@127.0.0.1/0"])
def test_opening_a_store_never_echoes_a_password_that_is_not_percent_encoded(url: str):
    """Under `uvicorn app.main:app` the URL is first parsed by the store itself, and uvicorn logs the error."""
    with pytest.raises(ValueError, match="percent-encoded") as raised:
        open_store(url)
    assert "secret" not in str(raised.value)


@pytest.mark.parametrize(
    ("variable", "workers"), [("MNEMO_PORT", "1"), ("MNEMO_PROBE_PORT", "1"), ("MNEMO_PROBE_PORT", "2")]
)
@pytest.mark.slow
def test_a_port_in_use_stops_startup_before_any_model_loads(variable: str, workers: str):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "MNEMO_PORT": str(free_port()), variable: str(port), "MNEMO_WORKERS": workers}
        env.pop("MNEMO_CONCURRENT_RUNS", None)
        done = run_app(env)
    assert done.returncode == 1
    names = "MNEMO_HOST:MNEMO_PORT" if variable == "MNEMO_PORT" else "MNEMO_HOST:MNEMO_PROBE_PORT"
    expected = f"cannot listen on 127.0.0.1:{port} ({names}): Address already in use"
    assert done.stderr.strip() == f"mnemo: cannot start: {expected}"


@pytest.mark.parametrize(("argument", "code"), [("--help", 0), ("--port=0", 2), ("serve", 2)])
@pytest.mark.slow
def test_python_m_app_is_mnemo_serve(argument: str, code: int):
    """`--help` lists the flags; a bad flag or an extra argument is a usage error (2), never a server started."""
    env = {**os.environ, "MNEMO_PORT": str(free_port())}
    done = run_app(env, argument)
    assert done.returncode == code
    if code == 0:
        assert "Usage: python -m app [OPTIONS]" in done.stdout and "--max-batch" in done.stdout
    else:
        assert "Usage: python -m app [OPTIONS]" in done.stderr and "serving" not in done.stderr


@pytest.mark.slow
def test_an_unknown_mnemo_variable_is_reported_with_the_nearest_setting():
    """A typo (MNEMO_MAX_BACTH, MNEMO_API_KEY: authentication off) was ignored without a word."""
    typos = {"MNEMO_MAX_BACTH": "8", "MNEMO_API_KEY": "a-key"}
    kubernetes = {"MNEMO_SERVICE_HOST": "10.0.0.1", "MNEMO_PORT_8000_TCP_ADDR": "10.0.0.1"}
    kubernetes["MNEMO_REDIS_PORT"] = "tcp://10.0.0.2:6379"  # service links, set by Kubernetes, not typos
    env = {**os.environ, "MNEMO_PORT": str(free_port()), "MNEMO_ARTIFACTS_DIR": "/nonexistent", **typos, **kubernetes}
    done = run_app(env)
    assert done.stderr.splitlines()[:2] == [
        "mnemo: warning: MNEMO_API_KEY is not a setting (did you mean MNEMO_API_KEYS?): ignored "
        "(the settings: docs/configuration.md)",
        "mnemo: warning: MNEMO_MAX_BACTH is not a setting (did you mean MNEMO_MAX_BATCH?): ignored "
        "(the settings: docs/configuration.md)",
    ]
    assert "SERVICE_HOST" not in done.stderr and "_TCP" not in done.stderr and "REDIS" not in done.stderr


def test_health_is_answered_directly_and_counted_under_its_route(client):
    """GET and HEAD /health skip FastAPI's router (`RequestEdge.direct`) with the same answer, and the metrics
    name the route's template, as for a routed request."""
    get, head = client.get("/health"), client.head("/health")
    assert (get.status_code, get.json(), head.status_code, head.content) == (200, {"status": "ok"}, 200, b"")
    assert head.headers["content-length"] == get.headers["content-length"] and head.headers["x-request-id"]
    metrics = client.get("/metrics").text
    assert 'mnemo_http_requests_total{method="HEAD",route="/health",status="200"}' in metrics, metrics


def test_behind_a_root_path_the_docs_pages_link_below_it():
    """Under `--root-path /api` the pages load the schema and their assets below the prefix, as FastAPI's own pages
    do, and their Content-Security-Policy hashes the scripts they hold."""
    with TestClient(create_app(app_settings(DEFAULT_ARTIFACTS_DIR)), root_path="/api") as client:
        for path in ("/api/docs", "/api/redoc"):
            page = client.get(path)
            assert page.status_code == 200 and "'/api/openapi.json'" in page.text.replace('"', "'"), page.text
            assert "/api/docs-assets/" in page.text and "'/openapi.json'" not in page.text.replace('"', "'")
            assert "sha256-" in page.headers["content-security-policy"] or "<script>" not in page.text
        assert client.get("/api/docs-assets/swagger-ui.css").status_code == 200
        assert "'/docs/oauth2-redirect'" not in client.get("/api/docs").text.replace('"', "'")


def test_behind_a_root_path_the_edge_reads_the_path_below_it():
    """Served under a prefix (`uvicorn --root-path /api`, Ray Serve's route_prefix), the edge's checks read the path
    the routes see: /v2 errors in the protocol's shape, the open paths open, the task routes called directly."""
    app = create_app(app_settings(DEFAULT_ARTIFACTS_DIR, api_keys="k1"))
    with TestClient(app, root_path="/api") as client:
        assert client.get("/api/health").status_code == 200  # an open path: no key
        missing = client.get("/api/v2/models/nope", headers={"Authorization": "Bearer k1"})
        assert missing.status_code == 404
        assert set(missing.json()) == {"error"} and "nope" in missing.json()["error"]
        assert client.get("/api/v2/models/nope").json() == {"error": client.get("/v2/models/nope").json()["error"]}
        answer = client.post("/api/similarity", json={}, headers={"Authorization": "Bearer k1"})
        assert answer.status_code == 422 and answer.request.url.path == "/api/similarity"


def test_answered_requests_leave_no_garbage_cycle_and_startup_objects_are_frozen():
    """A request's objects are freed when it ends, not left in a cycle for the garbage collector; what startup made
    is frozen while the app serves, so that a full collection walks only what came after, and is thawed at shutdown.
    A full collection over the started app's objects pauses the event loop for tens of milliseconds."""
    app = create_app(app_settings(DEFAULT_ARTIFACTS_DIR))
    bodies = {
        "/similarity": {"sentence_a": "a man plays", "sentence_b": "a dog runs", "return_attention": True},
        "/knowledge-trace": {"interactions": [{"question": 3, "correct": True}] * 5, "next_questions": [2]},
    }
    requests = [(path, json.dumps(body).encode()) for path, body in bodies.items()]

    async def serve() -> tuple[int, int, set[int]]:
        async with app.router.lifespan_context(app):
            frozen = gc.get_freeze_count()
            statuses = {await call(app, path, body) for path, body in requests * 3}
            gc.disable()
            try:
                statuses |= {await call(app, path, body) for path, body in requests * 20}
                return frozen, gc.collect(), statuses
            finally:
                gc.enable()

    frozen, found, statuses = asyncio.run(serve())
    assert statuses == {200}
    assert frozen > 10_000 and gc.get_freeze_count() == 0
    assert found == 0, f"{found} objects of answered requests were left in cycles"
