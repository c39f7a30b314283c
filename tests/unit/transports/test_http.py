"""The frame over HTTP (TestClient, real app, real onnxruntime on toy models): statuses, shapes, ids, logs, metrics."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient
from onnx import TensorProto
from starlette.requests import Request

from app.core.integrity import sha256_of
from app.core.logging import JsonFormatter, route_path
from app.main import create_app
from app.transports.deadline import ClientGone, within_deadline
from app.transports.error_handlers import EXCHANGE
from app.transports.http import unrepresentable, utf8_body
from tests.conftest import COMMITTED
from tests.helpers import app_client, app_settings, free_port
from tests.toy_model import toy, toy_app, toy_entry, write_toy_artifacts

GOOD = {"x": [[1, 2, 3]], "k": [1]}


@pytest.fixture
def toy_client(toy_artifacts) -> Iterator[TestClient]:
    with app_client(toy_artifacts, toy=True, max_body_bytes=4096) as client:
        yield client


def test_operations_endpoints(toy_client, toy_artifacts):
    assert toy_client.get("/health").json() == {"status": "ok"}
    assert toy_client.get("/ready").json() == {"status": "ready", "models": 3}
    listed = {m["name"]: m for m in toy_client.get("/models").json()["models"]}
    assert set(listed) == {"toy-a", "toy-b", "toy-kt"}
    toy_a = listed["toy-a"]
    assert toy_a["task"] == "toy" and listed["toy-kt"]["task"] == "toy-other"
    assert toy_a["version"] == "0.0.1" and toy_a["sha256"] == sha256_of(toy_artifacts / "toy-a.onnx")
    assert toy_a["provider"] == "CPUExecutionProvider" and toy_a["ready"] is True
    assert toy_a["default"] is True and listed["toy-b"]["default"] is False
    assert toy_a["limits"] == {"max_rows": 64} and toy_a["metrics"] == {"test_score": 1.0}
    assert toy_a["metadata"] == {"width": 3} and toy_a["width"] == 3  # the task's own fields
    assert toy_client.get("/docs").status_code == 200
    assert {"/health", "/ready", "/models", "/metrics", "/toy"} <= set(toy_client.get("/openapi.json").json()["paths"])


def test_inference_through_the_registry(toy_client):
    response = toy_client.post("/toy", json={"model": "toy-b", "x": [[1, 2, 3], [0, 0.5, -1]], "k": [1, 7]})
    assert response.status_code == 200
    assert response.json() == {"model": "toy-b", "y": [[2, 4, 6], [0, 1, -2]], "z": [2, 8]}


def test_unknown_model_is_404_listing_the_names_of_the_task(toy_client):
    response = toy_client.post("/toy", json={**GOOD, "model": "toy-z"})
    assert response.status_code == 404
    assert response.json() == {"detail": "Unknown toy model 'toy-z'; available: toy-a, toy-b."}


# -- 422: one shape for schema errors, model rules and inputs onnxruntime rejects ----------------------
def _assert_validation_shape(response, loc: list) -> str:
    assert response.status_code == 422, response.text
    (error,) = [e for e in response.json()["detail"] if e["loc"] == loc]
    assert isinstance(error["msg"], str) and error["msg"] and isinstance(error["type"], str)
    return error["msg"]


def test_schema_error_is_fastapis_422(toy_client):
    _assert_validation_shape(toy_client.post("/toy", json={"x": [[1, 2, 3]]}), ["body", "k"])
    _assert_validation_shape(toy_client.post("/toy", json={**GOOD, "k": ["a"]}), ["body", "k", 0])


def test_invalid_input_is_422_in_the_same_shape(toy_client):
    response = toy_client.post("/toy", json={"x": [[1, 2, 3]] * 2, "k": [1, -4]})
    assert response.json() == {
        "detail": [{"loc": ["body", "k", 1], "msg": "k must be >= 0, got -4", "type": "value_error"}],
        "error_count": 1,  # as in a schema 422
    }
    too_many = toy_client.post("/toy", json={"x": [[1, 2, 3]] * 65, "k": [1] * 65})
    assert _assert_validation_shape(too_many, ["body", "k"]) == "at most 64 items"


@pytest.mark.parametrize(
    "body",
    [
        {"x": [[1, 2]], "k": [1]},  # the graph fixes the width at 3
        {"x": [[1, 2, 3, 4], [5, 6, 7, 8]], "k": [1, 2]},
    ],
)
def test_input_the_graph_rejects_is_422_not_500(toy_client, body, mnemo_logs):
    response = toy_client.post("/toy", json=body)
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["loc"] == ["body"] and error["msg"].startswith("The model rejected the input:")
    assert "dimension" in error["msg"].lower()
    assert any("model rejected the input" in line for line in mnemo_logs.messages("mnemo.errors"))  # a warning
    assert toy_client.get("/health").status_code == 200


def test_input_the_graph_rejects_under_v2_is_the_protocols_400(toy_client):
    """The Open Inference Protocol answers onnxruntime's rejection as its 400, in its shape (`error`)."""
    toy_client.app.router.add_api_route("/v2/toy", toy, methods=["POST"])
    response = toy_client.post("/v2/toy", json={"x": [[1, 2]], "k": [1]})
    assert response.status_code == 400, response.text
    assert response.json()["error"].startswith("The model rejected the input:")


def test_a_feed_of_the_wrong_dtype_is_422_not_500(tmp_path):
    """The toy router feeds int64; a graph that takes int32 rejects it inside onnxruntime."""
    artifacts = write_toy_artifacts(tmp_path, [toy_entry("toy-int32")], int_type=TensorProto.INT32)
    with app_client(artifacts, toy=True) as client:
        response = client.post("/toy", json=GOOD)
    assert response.status_code == 422 and "type" in response.json()["detail"][0]["msg"]


@pytest.mark.parametrize("body", [b"{not json", b"[]", b'"text"', b"null", b"", b"\xff\xfe"])
def test_malformed_bodies_are_422(toy_client, body):
    response = toy_client.post("/toy", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422 and isinstance(response.json()["detail"], list)


def test_a_bug_is_logged_and_answered_500_as_last_resort(toy_artifacts, mnemo_logs):
    with app_client(toy_artifacts, toy=True, raise_server_exceptions=False) as client:
        response = client.get("/toy/bug")
        assert client.get("/toy/bug/secret-learner-42").status_code == 500
    assert response.status_code == 500 and response.json() == {"detail": "Internal error; it has been logged."}
    errors = [r for r in mnemo_logs.records if r.name == "mnemo.errors"]
    assert errors and errors[0].exc_info and "deliberate bug" in str(errors[0].exc_info[1])
    assert "GET /toy/bug/{owner}" in errors[-1].getMessage()  # the route template: ids never reach the log
    rid = response.headers["x-request-id"]  # the access line's id too: the two lines join on it
    assert errors[0].request_id == rid and errors[0].getMessage().endswith(f" id={rid}"), errors[0].getMessage()
    assert not any("secret-learner-42" in record.getMessage() for record in mnemo_logs.records)


# -- 413 --------------------------------------------------------------------------------------------
def test_body_over_the_limit_is_413_declared_or_streamed(toy_client):
    big = {"x": [[1.0, 2.0, 3.0]] * 1000, "k": [1] * 1000}
    response = toy_client.post("/toy", json=big)
    assert response.status_code == 413
    assert response.json() == {"detail": "Request body is larger than the limit of 4096 bytes (MNEMO_MAX_BODY_BYTES)."}

    def chunks():  # no Content-Length: counted while it arrives
        yield b'{"x": [[1, 2, 3]], "k": [1], "pad": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}'

    streamed = toy_client.post("/toy", content=chunks(), headers={"content-type": "application/json"})
    assert streamed.status_code == 413 and "x-request-id" in streamed.headers
    assert toy_client.post("/toy", json=GOOD).status_code == 200  # still serving


def test_body_just_under_the_limit_is_read(toy_client):
    body = json.dumps({**GOOD, "pad": "x" * (4096 - 60)}).encode()
    assert len(body) <= 4096
    assert toy_client.post("/toy", content=body, headers={"content-type": "application/json"}).status_code == 200


# -- request ids, access log, metrics ----------------------------------------------------------------
def test_every_response_has_a_request_id_and_a_sane_incoming_one_is_kept(toy_client):
    assert len(toy_client.get("/health").headers["x-request-id"]) == 32
    assert toy_client.get("/health").headers["x-content-type-options"] == "nosniff"
    assert toy_client.get("/health", headers={"X-Request-ID": "abc-123"}).headers["x-request-id"] == "abc-123"
    assert toy_client.get("/health", headers={"X-Request-ID": "x" * 500}).headers["x-request-id"] != "x" * 500
    for unusable in ("caf\u00e9-42".encode(), b"caf\xe9-42", b"two words", b"id status=200"):  # echoed bytes could
        echoed = toy_client.get("/health", headers=[(b"x-request-id", unusable)]).headers["x-request-id"]  # differ,
        assert len(echoed) == 32 and echoed.isalnum()  # or forge an access-line field: a new id instead
    assert toy_client.get("/nope").headers["x-request-id"]
    assert toy_client.post("/toy", json={"x": []}).headers["x-request-id"]


def test_one_access_line_per_request_with_its_id(toy_client, mnemo_logs):
    toy_client.post("/toy", json=GOOD, headers={"X-Request-ID": "req-1"})
    toy_client.post("/toy", json={**GOOD, "model": "toy-z"}, headers={"X-Request-ID": "req-2"})
    toy_client.get("/health", headers={"X-Request-ID": "req-3"})
    access = [r for r in mnemo_logs.records if r.name == "mnemo.access"]
    assert [(r.request_id, r.method, r.path, r.status) for r in access] == [
        ("req-1", "POST", "/toy", 200),
        ("req-2", "POST", "/toy", 404),
        ("req-3", "GET", "/health", 200),
    ]
    line = json.loads(JsonFormatter().format(access[0]))
    assert line["logger"] == "mnemo.access" and line["request_id"] == "req-1" and line["duration_ms"] >= 0


def test_a_task_endpoint_answered_before_routing_is_labelled_without_building_the_openapi_document():
    """A 413 or an early 429 on a task endpoint (a direct route) is labelled by its path: building the OpenAPI document
    (a fraction of a second of the event loop, in the midst of an overload) is left to /openapi.json."""
    app = create_app(app_settings(COMMITTED, max_body_bytes=4096))
    assert TestClient(app).post("/knowledge-trace", content=b"x" * 5000).status_code == 413
    assert 'route="/knowledge-trace",status="413"' in app.state.metrics.render().decode()
    assert app.openapi_schema is None


def test_metrics_by_route_template_and_status_and_inference_by_model(toy_client):
    toy_client.post("/toy", json=GOOD)
    toy_client.post("/toy", json={**GOOD, "model": "toy-b"})
    toy_client.post("/toy", json={**GOOD, "model": "toy-z"})
    toy_client.get("/does-not-exist")
    for invented in ("PROPFIND", "M-SEARCH", "MKCALENDAR"):  # the HTTP parser takes these: one label, not three
        toy_client.request(invented, "/toy")
    response = toy_client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert 'mnemo_http_requests_total{method="POST",route="/toy",status="200"} 2.0' in text
    assert 'mnemo_http_requests_total{method="POST",route="/toy",status="404"} 1.0' in text
    assert 'mnemo_http_requests_total{method="GET",route="unmatched",status="404"} 1.0' in text
    assert 'mnemo_http_request_duration_seconds_count{method="POST",route="/toy"} 3.0' in text
    assert 'mnemo_http_requests_total{method="other",route="/toy",status="405"} 3.0' in text
    assert "PROPFIND" not in text
    assert 'mnemo_inference_duration_seconds_count{model="toy-a"} 1.0' in text
    assert 'mnemo_inference_duration_seconds_count{model="toy-b"} 1.0' in text


def test_each_app_has_its_own_metrics(toy_artifacts):
    with (
        app_client(toy_artifacts, toy=True) as first,
        app_client(toy_artifacts, toy=True) as second,
    ):
        first.post("/toy", json=GOOD)
        assert 'route="/toy",status="200"} 1.0' in first.get("/metrics").text
        assert 'route="/toy"' not in second.get("/metrics").text


def test_json_log_format_writes_one_object_per_line(toy_artifacts, capfd):
    with app_client(toy_artifacts, toy=True, log_format="json") as client:
        client.get("/health", headers={"X-Request-ID": "json-1"})
    lines = [json.loads(line) for line in capfd.readouterr().err.splitlines() if line.startswith("{")]
    assert any(line.get("request_id") == "json-1" and line["status"] == 200 for line in lines)
    assert logging.getLogger("uvicorn.access").disabled  # uvicorn's own access line would be a second one


def test_rows_the_batcher_cancelled_are_a_client_gone_not_a_leaked_cancellation(toy_artifacts):
    """The batcher may cancel the rows a request awaits (their client is gone) before the request's own task
    learns it: that is a 499 counted as cancelled, not a CancelledError escaping to uvicorn's error log."""
    app = toy_app(app_settings(toy_artifacts))

    async def connected() -> dict:  # receive() of a client that has not left, as far as the server knows
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    async def scenario() -> None:
        rows = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.01, rows.cancel)  # what `_Item.abandoned` does

        async def work() -> object:
            return await rows

        with pytest.raises(ClientGone):
            await within_deadline(work(), app.state, "toy-a", receive=connected)

    asyncio.run(scenario())
    assert 'mnemo_requests_cancelled_total{model="toy-a"} 1.0' in app.state.metrics.render().decode()


def test_the_body_read_is_not_kept_by_the_request_while_it_is_served():
    """Parsed, a long history's bytes are freed: the request holds no copy until its answer is sent."""
    messages = [{"type": "http.request", "body": b'{"a":', "more_body": True}, {"type": "http.request", "body": b" 1}"}]

    async def receive():
        return messages.pop(0)

    async def scenario():
        scope = {"type": "http", "method": "POST", "headers": [], EXCHANGE: SimpleNamespace(fields={})}
        request = Request(scope, receive)
        body = await utf8_body(request, json_only=True)
        with pytest.raises(RuntimeError, match="consumed"):  # the stream was read once, and no copy kept
            await request.body()
        return body

    assert asyncio.run(scenario()) == b'{"a": 1}'


def test_unrepresentable_names_the_first_lone_surrogate_or_non_finite_number_depth_first():
    first = unrepresentable(b'{"a": [1, {"b": "\\ud800"}], "c": NaN}')
    assert first.location == ("body", "a", 1, "b") and "lone UTF-16 surrogate" in first.message
    key = unrepresentable(b'{"a": {"\\udc00": 1}}')
    assert key.location == ("body", "a") and key.message.startswith("field names")
    assert unrepresentable(b'{"a": [0, 1e309]}').location == ("body", "a", 1)
    assert unrepresentable(b'{"a": "\\ud83d\\ude00", "b": [1.5]}') is None  # a surrogate pair is one character


def test_the_edge_takes_a_request_path_below_the_root_once(toy_artifacts, monkeypatch):
    """Refusals (413, a reserving route's body), routed and unmatched requests: one `route_path` each, the access
    line's included."""
    from app.core import logging as core_logging
    from app.transports import middleware

    calls = []
    for module in (middleware, core_logging):
        monkeypatch.setattr(module, "route_path", lambda scope: calls.append(scope["path"]) or route_path(scope))
    large = b'{"model": "toy-a", "x": [' + b"1," * 3000 + b"1]}"
    with app_client(toy_artifacts, toy=True, max_body_bytes=4096) as client:
        for request in (
            lambda: client.post("/toy", content=b"x" * 5000),
            lambda: client.post("/toy", json=GOOD),
            lambda: client.post("/toy/read", content=large),
            lambda: client.get("/ready"),
            lambda: client.get("/no-such-path"),
        ):
            calls.clear()
            request()
            assert len(calls) == 1, calls


def test_the_api_keys_are_read_once_for_the_edge_grpc_the_contract_and_the_log(toy_artifacts, monkeypatch):
    from app.transports.access import ApiKeys

    built, init = [], ApiKeys.__init__
    monkeypatch.setattr(ApiKeys, "__init__", lambda keys, settings: built.append(1) or init(keys, settings))
    with app_client(toy_artifacts, toy=True, api_keys="key-1", grpc_port=free_port()) as client:
        assert client.get("/models").status_code == 401
        assert "bearerAuth" in client.get("/openapi.json").json()["components"]["securitySchemes"]
    assert len(built) == 1
