"""The real task API on the committed models: listing, malformed bodies, empty manifests, the OpenAPI document."""

from __future__ import annotations

import json
import uuid

import pytest

from tests.conftest import COMMITTED, KT_MODEL, SIM_MODEL, manifest_models
from tests.helpers import app_client


def test_models_lists_every_model_with_task_limits_batching_and_metrics(client):
    listed = {m["name"]: m for m in client.get("/models").json()["models"]}
    assert set(listed) == {m["name"] for m in manifest_models(COMMITTED)}
    assert listed[KT_MODEL]["task"] == "knowledge-trace"
    assert listed[KT_MODEL]["n_questions"] == 50 and listed[KT_MODEL]["n_concepts"] == 5
    assert listed[SIM_MODEL]["task"] == "similarity" and listed[SIM_MODEL]["max_tokens"] == 64
    assert "test_pearson" in listed[SIM_MODEL]["metrics"] and "test_auc" in listed[KT_MODEL]["metrics"]
    entry = {m["name"]: m for m in manifest_models(COMMITTED)}[SIM_MODEL]
    cells = entry["batching"]["max_cells"]
    assert cells == 512 // entry["metadata"]["members"]  # one VLMP model's cap, divided by an ensemble's members
    expected = {"max_batch": 32, "max_wait_ms": 2.0, "max_queue": 512, "max_cells": cells}
    assert listed[SIM_MODEL]["batching"] == expected
    assert listed["dkvmn-assist2009"]["batching"]["max_cells"] == 200  # the manifest's per-model override
    assert "/" not in json.dumps([m["card"] for m in listed.values()])  # file names, never server paths


@pytest.mark.parametrize("body", [b"{not json", b"[]", b'"text"', b"null", b"", b"{}"])
def test_malformed_bodies_are_422_never_500(client, body):
    for path in ("/similarity", "/similarity/batch", "/knowledge-trace"):
        response = client.post(path, content=body, headers={"content-type": "application/json"})
        assert response.status_code == 422, (path, body, response.text)
        assert isinstance(response.json()["detail"], list)


def test_a_huge_invalid_body_gets_a_bounded_422(client):
    body = {"interactions": [{"question": 0, "correct": "y"}] * 10_000}  # a string is an id (a model's own), 0 not
    response = client.post("/knowledge-trace", json=body)
    assert response.status_code == 422
    assert len(response.json()["detail"]) == 20 and response.json()["error_count"] == 20_000
    assert len(response.content) < 10_000


def test_a_422_for_the_models_rules_lists_every_broken_one_not_only_the_first(client):
    many_tokens = "word " * 100  # within the schema's characters, past the model's 64 tokens
    pairs = [{"sentence_a": many_tokens, "sentence_b": "fine words"}, {"sentence_a": "ok", "sentence_b": many_tokens}]
    locations = [error["loc"] for error in client.post("/similarity/batch", json={"pairs": pairs}).json()["detail"]]
    assert locations == [["body", "pairs", 0, "sentence_a"], ["body", "pairs", 1, "sentence_b"]]
    sentences = [many_tokens, "fine", many_tokens]
    embeddings = client.post("/embeddings", json={"model": SIM_MODEL, "sentences": sentences}).json()
    assert [error["loc"] for error in embeddings["detail"]] == [["body", "sentences", 0], ["body", "sentences", 2]]
    history = {"interactions": [{"question": 999, "correct": True}] * 30, "next_questions": [1, 999]}
    response = client.post("/knowledge-trace", json={"model": KT_MODEL, **history})
    listed = [error["loc"] for error in response.json()["detail"]]
    assert response.status_code == 422 and response.json()["error_count"] == 31 and len(listed) == 20
    assert listed[:2] == [["body", "interactions", 0, "question"], ["body", "interactions", 1, "question"]]
    student = client.post(f"/students/{uuid.uuid4().hex}/interactions", json={"model": KT_MODEL, **history})
    assert student.status_code == 422 and student.json()["error_count"] == 31


def test_a_non_json_content_type_is_415(client):
    response = client.post("/similarity", content=b"sentence_a=x", headers={"content-type": "text/plain"})
    assert response.status_code == 415 and "application/json" in response.json()["detail"]


def test_empty_manifest_is_ready_and_task_endpoints_say_no_model(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"schema_version": 1, "models": []}))
    with app_client(tmp_path) as client:
        assert client.get("/ready").status_code == 200
        assert client.get("/models").json() == {"models": []}
        response = client.post("/similarity", json={"sentence_a": "a", "sentence_b": "b"})
        assert response.status_code == 404 and "No similarity model" in response.json()["detail"]


def test_openapi_documents_every_endpoint_with_examples_and_bodies(client):
    schema = client.get("/openapi.json").json()
    paths = {"/similarity", "/similarity/batch", "/knowledge-trace", "/health", "/ready", "/models", "/metrics"}
    assert paths | {"/models/{name}/questions"} <= set(schema["paths"])
    for name in ("SimilarityRequest", "SimilarityBatchRequest", "KnowledgeTraceRequest"):
        assert schema["components"]["schemas"][name]["examples"]
    body = schema["paths"]["/knowledge-trace"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/KnowledgeTraceRequest"}
    assert "Interaction" in schema["components"]["schemas"]
    assert client.get("/docs").status_code == 200


def test_every_request_body_example_in_the_openapi_document_is_answered(client):
    """What /docs offers to try works on the committed models (path parameters filled with a new student id)."""
    schema = client.get("/openapi.json").json()
    tried = []
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            content = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
            reference = content.get("schema", {}).get("$ref", "")
            examples = schema["components"]["schemas"].get(reference.rsplit("/", 1)[-1], {}).get("examples", [])
            url = path.replace("{student_id}", f"example-{uuid.uuid4().hex}")
            for example in examples:
                response = client.request(method.upper(), url, json=example)
                assert response.status_code == 200, (method, path, response.text[:300])
                tried.append(path)
    assert {"/similarity", "/similarity/from-embeddings", "/knowledge-trace", "/embeddings"} <= set(tried)


def test_head_is_get_without_the_body(client):
    """RFC 9110: a resource that answers GET answers HEAD, with the same status and headers."""
    for path in ("/models", "/", "/openapi.json", "/models/dkvmn-assist2009/questions", "/v2/health/live"):
        got, head = client.get(path), client.head(path)
        assert head.status_code == got.status_code == 200, path
        assert head.content == b"" and head.headers["content-length"] == str(len(got.content)), path
        assert head.headers["content-type"] == got.headers["content-type"], path
    refused = client.head("/similarity")  # a POST-only path: 405 naming what it takes
    assert refused.status_code == 405 and refused.headers["allow"] == "POST" and refused.content == b""
    metrics = client.get("/metrics").text  # a HEAD is counted under the route its GET matched
    assert 'mnemo_http_requests_total{method="HEAD",route="/models",status="200"}' in metrics
    assert 'mnemo_http_requests_total{method="HEAD",route="unmatched"' not in metrics
