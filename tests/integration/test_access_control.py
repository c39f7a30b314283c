"""API keys (Bearer) and CORS over real HTTP, against `python -m app` with an empty manifest."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers import Server, run_app, running_server
from tests.integration.test_connection_limits import final_answer_without_100_continue
from tests.integration.test_hostile_requests import status_of
from tests.toy_model import write_empty_manifest

pytestmark = pytest.mark.slow  # each test starts a server, a browser or a training run: seconds (-m "not slow")

KEYS = ("key-one-8f3b2c", "key-two-91ad7e")
ORIGIN = "https://app.example"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("access")
    keys_file = root / "keys.txt"
    keys_file.write_text(f"# deploy keys\n{KEYS[1]}\n\n")
    env = {"MNEMO_API_KEYS": KEYS[0], "MNEMO_API_KEYS_FILE": str(keys_file), "MNEMO_CORS_ORIGINS": ORIGIN}
    with running_server(write_empty_manifest(root / "artifacts"), **env) as live:
        yield live
    text = "\n".join(live.output)
    assert all(key not in text for key in KEYS), "an API key was logged"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize(
    "headers",
    [{}, bearer("wrong"), {"Authorization": f"Basic {KEYS[0]}"}, {"Authorization": "Bearer"}, bearer(KEYS[0] + "x")],
)
def test_protected_paths_need_a_known_key(server, headers):
    for method, path in (("GET", "/models"), ("GET", "/metrics"), ("POST", "/similarity")):
        response = httpx.request(method, f"{server.url}{path}", headers=headers, json={})
        assert response.status_code == 401, (path, response.text)
        assert response.headers["www-authenticate"].startswith('Bearer realm="mnemo"')
        assert "Authorization: Bearer" in response.json()["detail"]


def test_the_inference_protocol_answers_a_missing_key_in_its_own_error_shape(server):
    response = httpx.post(f"{server.url}/v2/models/dkvmn-assist2009/infer", json={"inputs": []})
    assert response.status_code == 401 and response.headers["www-authenticate"].startswith("Bearer")
    assert set(response.json()) == {"error"} and "Authorization: Bearer" in response.json()["error"]


@pytest.mark.parametrize("key", KEYS)
def test_a_key_from_the_variable_or_the_file_is_accepted(server, key):
    assert httpx.get(f"{server.url}/models", headers=bearer(key)).json() == {"models": []}
    assert httpx.get(f"{server.url}/metrics", headers=bearer(key)).status_code == 200
    response = httpx.post(f"{server.url}/similarity", headers=bearer(key), json={"sentence_a": "a", "sentence_b": "b"})
    assert response.status_code == 404  # past authentication: there is no similarity model in this manifest


def test_probes_docs_and_the_explorer_page_stay_open(server):
    for path in (
        "/health",
        "/ready",
        "/v2/health/live",
        "/docs",
        "/redoc",
        "/openapi.json",
        "/",
        "/explorer/js/main.js",
    ):
        assert httpx.get(f"{server.url}{path}").status_code == 200, path
    assert httpx.get(f"{server.url}/explorer/js/missing.js").status_code == 404  # open, but only its own files
    assert httpx.head(f"{server.url}/health").status_code == 200


def test_openapi_declares_the_bearer_scheme_on_protected_operations_only(server):
    schema = httpx.get(f"{server.url}/openapi.json").json()
    assert schema["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "one of MNEMO_API_KEYS",
    }
    assert schema["paths"]["/models"]["get"]["security"] == [{"bearerAuth": []}]
    assert "401" in schema["paths"]["/similarity"]["post"]["responses"]
    assert "security" not in schema["paths"]["/health"]["get"]


def test_cors_preflight_and_responses_for_an_allowed_origin(server):
    preflight = httpx.options(
        f"{server.url}/similarity",
        headers={
            "Origin": ORIGIN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == ORIGIN
    assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
    erase = httpx.options(
        f"{server.url}/students/learner-1",
        headers={"Origin": ORIGIN, "Access-Control-Request-Method": "DELETE"},
    )
    assert erase.status_code == 200 and "DELETE" in erase.headers["access-control-allow-methods"]
    binary = httpx.options(  # the Open Inference Protocol's binary tensor data, from a browser
        f"{server.url}/v2/models/x/infer",
        headers={
            "Origin": ORIGIN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "inference-header-content-length, content-type",
        },
    )
    assert (
        binary.status_code == 200
        and "inference-header-content-length" in binary.headers["access-control-allow-headers"]
    )
    denied = httpx.get(f"{server.url}/models", headers={"Origin": ORIGIN})
    assert denied.status_code == 401 and denied.headers["access-control-allow-origin"] == ORIGIN
    allowed = httpx.get(f"{server.url}/models", headers={"Origin": ORIGIN, **bearer(KEYS[0])})
    exposed = allowed.headers["access-control-expose-headers"].lower()
    assert "x-request-id" in exposed and "inference-header-content-length" in exposed


def test_cors_refuses_other_origins(server):
    preflight = httpx.options(
        f"{server.url}/similarity",
        headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert preflight.status_code == 400 and "access-control-allow-origin" not in preflight.headers


@pytest.mark.parametrize(
    ("path", "method", "refused"),
    [("/similarity", "POST", "origin"), ("/v2/models/x/infer", "POST", "origin"), ("/models", "PUT", "method")],
)
def test_a_refused_preflight_is_json_with_a_request_id(server, path, method, refused):
    origin = "https://evil.example" if refused == "origin" else ORIGIN
    preflight = httpx.options(
        f"{server.url}{path}", headers={"Origin": origin, "Access-Control-Request-Method": method}
    )
    assert preflight.status_code == 400 and preflight.headers["content-type"] == "application/json"
    assert len(preflight.headers["x-request-id"]) == 32 and preflight.headers["x-content-type-options"] == "nosniff"
    payload = preflight.json()
    message = payload["error"] if path.startswith("/v2") else payload["detail"]  # /v2 answers in its own shape
    assert f"Disallowed CORS {refused}" in message and "MNEMO_CORS_ORIGINS" in message


def test_without_keys_nothing_asks_for_one(tmp_path):
    with running_server(write_empty_manifest(tmp_path / "artifacts")) as live:
        assert httpx.get(f"{live.url}/models").status_code == 200
        schema = httpx.get(f"{live.url}/openapi.json").json()
        assert "securitySchemes" not in schema["components"]
        assert httpx.options(f"{live.url}/similarity").status_code == 405  # CORS is off


def test_a_keys_file_without_keys_stops_startup_with_one_line(tmp_path):
    empty = tmp_path / "keys.txt"
    empty.write_text("# nothing yet\n")
    result = run_app(
        {"MNEMO_API_KEYS_FILE": str(empty), "MNEMO_ARTIFACTS_DIR": str(Path(tmp_path)), "PATH": "/usr/bin"}
    )
    assert result.returncode == 1
    assert "MNEMO_API_KEYS_FILE" in result.stderr and "holds no API key" in result.stderr


@pytest.mark.parametrize("order", [("wrong", KEYS[0]), (KEYS[0], "wrong"), (KEYS[0], KEYS[0])])
def test_a_repeated_authorization_header_is_a_400_naming_it(server, order):
    """A proxy checking the first copy and the server the last would see different keys: neither is taken."""
    headers = [("Authorization", f"Bearer {key}") for key in order]
    for path in ("/models", "/similarity"):
        response = httpx.post(f"{server.url}{path}", headers=headers, json={})
        assert response.status_code == 400, (path, response.text)
        assert "Authorization" in response.json()["detail"] and "www-authenticate" not in response.headers
    protocol = httpx.post(f"{server.url}/v2/models/x/infer", headers=headers, json={})
    assert protocol.status_code == 400 and "Authorization" in protocol.json()["error"]


@pytest.mark.parametrize(
    "name", ["Content-Type", "Content-Encoding", "X-Request-ID", "Inference-Header-Content-Length"]
)
def test_other_headers_read_as_one_value_may_not_be_repeated(server, name):
    values = {
        "Content-Type": ("application/json", "text/plain"),
        "Content-Encoding": ("identity", "gzip"),
        "X-Request-ID": ("first-id", "second-id"),
        "Inference-Header-Content-Length": ("2", "0"),
    }[name]
    headers = [*bearer(KEYS[0]).items(), *((name, value) for value in values)]
    response = httpx.post(f"{server.url}/similarity", headers=headers, content=b"{}")
    assert response.status_code == 400 and name in response.json()["detail"], response.text
    assert response.headers["x-request-id"] not in values and response.headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize("path", [b"/similarity", b"/v2/models/dkvmn-assist2009/infer"])
def test_a_request_without_a_key_gets_its_401_without_100_continue(server, path):
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        head = b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        assert status_of(final_answer_without_100_continue(sock, head)) == 401
